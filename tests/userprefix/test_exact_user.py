"""`exact-user`: the lossless peer of every cached-user fast path (the user side reused only
where it was built exactly, every candidate token computed) equals full, on a user-prefix miss
and on a hit, and is named in results, bench rows and eval rows."""

import json

import pytest
import torch

from rcllm.cli import main
from rcllm.commands.common import Variant, parse_methods, pointwise_variants
from rcllm.config import RcllmConfig, ReuseConfig, load
from rcllm.engine import Engine
from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.prompt import RankRequest


@pytest.fixture(scope="module")
def workload():
    ds = load_dataset("", "synthetic", num_users=20, num_items=60, seed=3)
    return ds, build_cases(ds, history_window=6, num_negatives=9, seed=0, max_cases=3)


def _engine(loaded, ds, scorer="pointwise"):
    return Engine(loaded, ds.items, load(RcllmConfig, None, ["reuse.prefix_insert=false"]),
                  scorer=scorer)


def _req(case):
    return RankRequest(case.user_id, case.history, tuple(case.candidates))


def _scores(res, case):
    return torch.tensor([res.scores[c] for c in case.candidates])


def test_the_alias_resolves_to_late_at_layer_0_with_an_exact_user_side():
    got = ReuseConfig(method="exact-user", late_layer=7, user_side="reuse",
                      user_prefix=False).resolved()
    assert (got.method, got.late_layer, got.user_prefix, got.user_side) == (
        "late", 0, True, "exact")
    assert ReuseConfig(method="naive").resolved() == ReuseConfig(method="naive")


def test_exact_user_equals_full_on_a_miss_and_on_a_hit(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    # items in the store: exact-user must not take them (every candidate token computed)
    for case in cases:
        eng.build_items(case.candidates)
        eng.build_history(case.history)
    for case in cases:
        full = _scores(eng.rank(_req(case), "full"), case)
        miss = eng.rank(_req(case), "exact-user")
        assert miss.method == "exact-user"
        assert miss.stats["user_prefix"] == "miss"
        assert sum(miss.stats["reused_tokens"].values()) == 0
        torch.testing.assert_close(_scores(miss, case), full, rtol=1e-4, atol=1e-4)
        hit = eng.rank(_req(case), "exact-user")
        assert hit.stats["user_prefix"] == "hit" and hit.stats["user_prefix_tokens"] > 0
        assert hit.stats["reused_tokens"]["item"] == 0
        assert hit.stats["recomputed_tokens"] == hit.stats["tokens"] - hit.stats[
            "user_prefix_tokens"]
        torch.testing.assert_close(_scores(hit, case), full, rtol=1e-4, atol=1e-4)


def test_a_user_side_built_from_reused_chunks_is_not_served(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[1]
    eng.build_history(case.history)
    eng.build_items(case.candidates)
    eng.rank(_req(case), "naive", user_side="reuse")   # stores a user side built by reuse
    assert eng.rank(_req(case), "naive", user_side="reuse").stats["user_prefix"] == "hit"
    got = eng.rank(_req(case), "exact-user", user_side="reuse")  # the alias's own side wins
    assert got.stats["user_prefix"] == "miss"
    torch.testing.assert_close(_scores(got, case), _scores(eng.rank(_req(case), "full"), case),
                               rtol=1e-4, atol=1e-4)


def test_the_listwise_prompt_refuses_it_and_names_its_exact_peer(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds, scorer="verbalizer")
    with pytest.raises(RcllmError, match="pointwise scorer.*'prefix'"):
        eng.rank(_req(cases[0]), "exact-user")


def test_rows_name_it_and_warm_its_user_side():
    assert Variant("exact-user", user_prefix=True).label == "exact-user"
    assert [v.label for v in pointwise_variants()].count("exact-user") == 1
    (_, got) = parse_methods("full,exact-user", 0.3, 0.3)
    assert got.label == "exact-user" and got.user_prefix   # bench ttft warms it first


def test_bench_ttft_reports_every_path_beside_exact_user(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "ttft.json"
    rc = main(["bench", "ttft", "--set", f"model.path={tiny_model_dir}", "--set",
               "model.threads=0", "--requests", "2", "--candidates", "4", "--scorer",
               "pointwise", "--json", str(path)])
    assert rc == 0
    report = json.loads(path.read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    peer = rows["exact-user"]
    assert peer["speedup_vs_exact_user"] == 1.0 and peer["kl_vs_full"] < 1e-6
    late = rows["late +user prefix"]
    assert late["speedup_vs_exact_user"] == pytest.approx(
        peer["ttft_p50_ms"] / late["ttft_p50_ms"])
    assert report["summary"]["speedup_vs_exact_user"]["full"] == pytest.approx(
        peer["ttft_p50_ms"] / rows["full"]["ttft_p50_ms"])
    assert "speedup_vs_exact_user" in capsys.readouterr().out
