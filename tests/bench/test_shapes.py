"""`bench shapes` on a CPU with a scaled-down shape: a row per method, exactness of rcllm at a
1.0 budget against full recompute, and a fitted profile the simulator runs on."""

import json

import numpy as np
import pytest
import torch

from rcllm.bench import shapes as sh
from rcllm.cli import main
from rcllm.errors import RcllmError

TOKENS = 320


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    report, profile = out / "shapes.json", out / "profile.json"
    assert main(["bench", "shapes", "--shape", "tiny", "--device", "cpu", "--tokens",
                 f"{TOKENS},{TOKENS + 64}", "--repeats", "2", "--warmup", "0",
                 "--json", str(report), "--profile-out", str(profile)]) == 0
    return json.loads(report.read_text()), profile


def test_rows_for_every_method(run):
    report, _ = run
    assert report["name"] == "bench_shapes" and report["config"]["tokens"] == [TOKENS, TOKENS + 64]
    rows = [r for r in report["rows"] if r["tokens"] == TOKENS]
    assert [r["variant"] for r in rows] == ["full", "prefix", "naive", "cacheblend 0.15",
                                            "cacheblend 0.3", "rcllm 0.15/0.15", "rcllm 0.3/0.3"]
    by = {r["variant"]: r for r in rows}
    assert by["full"]["recomputed_fraction"] == 1.0 and by["full"]["reused_tokens"] == 0
    assert by["full"]["speedup_vs_full"] == 1.0
    assert by["prefix"]["prefix_tokens"] > 0 and by["prefix"]["reused_tokens"] == 0
    assert by["naive"]["recomputed_fraction"] < by["rcllm 0.15/0.15"]["recomputed_fraction"] \
        < by["rcllm 0.3/0.3"]["recomputed_fraction"] < 1.0
    for r in rows:
        assert r["ttft_p50_ms"] > 0 and r["repeats"] == 2
        assert r["speedup_vs_full"] == pytest.approx(by["full"]["ttft_p50_ms"] / r["ttft_p50_ms"])
    assert report["summary"][f"rcllm_0.3_0.3_speedup_vs_full_{TOKENS}"] == \
        by["rcllm 0.3/0.3"]["speedup_vs_full"]


def test_rcllm_at_full_budget_is_full_recompute(run):
    report, _ = run
    for check in report["summary"]["exactness"].values():
        for method in ("rcllm", "cacheblend"):
            assert check[method]["finite"]
            assert check[method]["recomputed_fraction"] > 0.8   # the exact prefix is not
            assert check[method]["max_abs_diff"] < 1e-4
    assert report["summary"]["exact_max_abs_diff"] < 1e-4


def test_profile_loads_in_the_simulator(run):
    from rcllm.routing.cost import MethodConfig
    from rcllm.serve.calibrate import load_profile
    from rcllm.sim.engine import SimConfig, simulate
    from rcllm.sim.placement import build_locality
    from rcllm.sim.workload import SyntheticSpec, poisson_arrivals_ms, synthetic_workload

    report, path = run
    profile = load_profile(path)
    assert profile.model.num_layers == 2 and profile.model.kv_dtype_bytes == 4
    assert profile.full_prefill_ms(TOKENS) > 0   # how the fit splits it is up to the noise
    assert set(profile.reuse_ms_per_token) >= {"full", "prefix", "naive", "cacheblend", "rcllm"}
    assert report["summary"]["profile"]["name"] == profile.name
    wl = synthetic_workload(SyntheticSpec(num_items=800, num_requests=60, num_communities=8,
                                          placement_requests=200))
    loc = build_locality(wl, 2)
    arrivals = poisson_arrivals_ms(np.random.default_rng(1), wl.num_requests, 1.0)
    for method in ("prefix", "rcllm"):
        res = simulate(wl, arrivals, loc, profile, SimConfig(MethodConfig(method)))
        res.check_invariants()
        assert np.all(np.isfinite(res.ttft_ms)) and np.all(res.ttft_ms > 0)


def test_prompt_layout_matches_the_engine():
    p = sh.synthetic_prompt(TOKENS, 100)
    kinds = p.kind.tolist()
    assert len(kinds) == TOKENS and kinds[0] == 0 and kinds[-1] == 4   # instruction .. question
    assert p.prefix_tokens % sh.PREFIX_BLOCK == 0 and 0 < p.prefix_tokens <= p.instruction
    starts = [i for i in range(1, TOKENS) if kinds[i] in (1, 2) and kinds[i - 1] == 3]
    assert len(starts) == sh.HISTORY_CHUNKS + sh.ITEM_CHUNKS
    assert all(p.offset[i] == 0 and p.offset[i + 1] == 1 for i in starts)
    with pytest.raises(RcllmError, match="too short"):
        sh.synthetic_prompt(100, 100)


def test_probe_methods_run_in_bfloat16():
    """bfloat16 is the GPU dtype; on the CPU it exercises the same dtype paths."""
    model = sh.random_transformer(sh.SHAPES["tiny"], torch.device("cpu"), torch.bfloat16, 400)
    inputs = sh.Inputs(model, sh.synthetic_prompt(TOKENS, model.arch.vocab_size))
    for v in (sh.Variant("cacheblend", 0.3, 0.3), sh.Variant("rcllm", 0.3, 0.3)):
        ms, res, logits = sh.timed_prefill(model, inputs, v)
        assert ms > 0 and torch.isfinite(logits).all() and 0 < res.computed.float().mean() < 1
    assert torch.get_default_dtype() == torch.float32   # restored after each prefill
    check = sh.exactness(model, inputs)
    assert check["rcllm"]["cosine"] > 0.999


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "shapes", "--shape", "tiny", "--device", "cuda"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
    with pytest.raises(RcllmError, match="cpu or cuda"):
        sh.resolve_device("tpu", None)


def test_a_profile_file_is_a_scenario_profile(run):
    from rcllm.sim.experiments import Scenario

    _, path = run
    speed = Scenario(profile=str(path)).speed()
    assert speed.model.num_layers == 2 and speed.full_prefill_ms(TOKENS) > 0
