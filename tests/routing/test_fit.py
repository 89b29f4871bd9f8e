import json
from pathlib import Path

import numpy as np
import pytest

from rcllm.cli import main
from rcllm.errors import RcllmError
from rcllm.routing.fit import fit_cpu_profile, predict_ms
from rcllm.routing.validate import (combine_repeats, load_bench_requests, validate,
                                     validate_transfer)

TRUE = {"fixed": 30.0, "per_token": 2.0, "per_pair": 4e-4,
        "reuse": {"full": 0.0, "prefix": 0.01, "rcllm": 0.15}}


def _measured(method, computed, context):
    return (TRUE["fixed"] + computed * (TRUE["per_token"] + TRUE["per_pair"] * context)
            + TRUE["reuse"][method] * (context - computed))


def _bench_json(path, n=60, noise=0.03, seed=0, slower=1.0, reference=None):
    """A file shaped like `rcllm bench ttft --json` output, from a known engine + noise, on a
    machine `slower` times slower than the reference one (`reference`: its reference passes)."""
    rng = np.random.default_rng(seed)
    reqs = []
    for method in ("full", "prefix", "rcllm"):
        for _ in range(n):
            ctx = int(rng.integers(800, 3000))
            comp = {"full": ctx, "prefix": ctx - 200,
                    "rcllm": int(ctx * rng.uniform(0.3, 0.6))}[method]
            ms = _measured(method, comp, ctx) * (1 + rng.normal(0, noise)) * slower
            reqs.append({"method": method, "context_tokens": ctx, "recomputed_tokens": comp,
                         "reused_tokens": ctx - comp, "ttft_ms": ms})
    rows = [{"method": m, "ttft_p50_ms": float(np.median([r["ttft_ms"] for r in reqs
                                                          if r["method"] == m]))}
            for m in ("full", "prefix", "rcllm")]
    summary = {"reference_ms": reference} if reference else {}
    path.write_text(json.dumps({"name": "bench.ttft", "config": {}, "rows": rows,
                                "summary": summary, "requests": reqs}))
    return path


def test_speed_reference_takes_a_slower_machine_out(tmp_path):
    """A test run made while the machine ran 1.4x slower: its reference passes say so, and the
    scaled validation predicts it as well as a run on the fit's machine; unscaled (or without
    references) the slowdown reads as a 0.29 error."""
    fit = load_bench_requests(str(_bench_json(tmp_path / "f.json", reference=[50.0, 52.0])))
    slow = load_bench_requests(str(_bench_json(tmp_path / "s.json", seed=1, slower=1.4,
                                               reference=[70.0, 72.8])))
    assert {r["run_reference_ms"] for r in slow} == {71.4}
    _, scaled = validate_transfer(fit, slow)
    _, raw = validate_transfer(fit, slow, speed_reference=False)
    assert scaled["speed_reference"] and not raw["speed_reference"]
    assert scaled["worst_median_rel_err_joint_fit"] < 0.05
    assert raw["worst_median_rel_err_joint_fit"] > 0.25
    bare = load_bench_requests(str(_bench_json(tmp_path / "b.json", seed=1, slower=1.4)))
    _, unknown = validate_transfer(fit, bare)   # a run without references: nothing scaled
    assert not unknown["speed_reference"] and unknown["worst_median_rel_err_joint_fit"] > 0.25


def test_repeats_merge_on_scaled_times(tmp_path):
    """Of two runs of the same requests, the one on the faster machine wins the merge, not the
    one whose raw times happen to be lower because the machine was slower in the other."""
    from rcllm.routing.validate import merged_records

    a = _bench_json(tmp_path / "a.json", n=4, noise=0.0, reference=[50.0, 50.0])
    b = _bench_json(tmp_path / "b.json", n=4, noise=0.0, slower=1.1, reference=[60.0, 60.0])
    for path in (a, b):   # the same requests need user ids to be merged
        data = json.loads(path.read_text())
        for i, r in enumerate(data["requests"]):
            r["user_id"] = str(i)
        path.write_text(json.dumps(data))
    merged = merged_records([str(a), str(b)], min_repeats=2)
    # b: raw 1.1x slower, but its machine was 1.2x slower: b's requests were the faster ones
    assert len(merged) == 12 and {r["run_reference_ms"] for r in merged} == {60.0}


def test_fit_recovers_exact_coefficients():
    rng = np.random.default_rng(1)
    pts, methods = [], []
    for m in ("full", "prefix", "rcllm"):
        for _ in range(20):
            ctx = int(rng.integers(100, 3000))
            comp = ctx if m == "full" else int(ctx * rng.uniform(0.2, 0.9))
            pts.append((comp, ctx, _measured(m, comp, ctx)))
            methods.append(m)
    prof = fit_cpu_profile(pts, methods)
    assert prof.fixed_ms == pytest.approx(TRUE["fixed"], rel=1e-3)
    assert prof.ms_per_token == pytest.approx(TRUE["per_token"], rel=1e-3)
    assert prof.ms_per_token_ctx == pytest.approx(TRUE["per_pair"], rel=1e-3)
    assert prof.reuse_ms_per_token["rcllm"] == pytest.approx(0.15, rel=1e-2)
    pred = predict_ms(prof, "rcllm", np.array([500]), np.array([2000]))
    assert pred[0] == pytest.approx(_measured("rcllm", 500, 2000), rel=1e-3)


def test_fit_rejects_too_few_or_bad_points():
    with pytest.raises(RcllmError):
        fit_cpu_profile([(1, 2, 3.0)] * 3)
    with pytest.raises(RcllmError):
        fit_cpu_profile([(5, 2, 3.0)] * 5)   # computed > context


def test_single_record_method_is_never_tested_on_its_training_point(tmp_path):
    reqs = json.loads(_bench_json(tmp_path / "b.json", n=10).read_text())["requests"]
    reqs.append({"method": "naive", "context_tokens": 2000, "recomputed_tokens": 100,
                 "reused_tokens": 1900, "ttft_ms": 500.0})
    rows, summary = validate(reqs)
    naive = [r for r in rows if r["method"] == "naive"]
    assert len(naive) == 2 and all(r["n_fit"] == 1 and r["n_test"] == 0 for r in naive)
    assert all(r["median_rel_err"] is None for r in naive)
    assert summary["untested_methods"] == ["naive"]
    others = [r for r in rows if r["method"] != "naive"]
    assert all(r["n_fit"] == 5 and r["n_test"] == 5 for r in others)


def test_transfer_needs_a_fitted_method_for_per_method_rows(tmp_path):
    reqs = json.loads(_bench_json(tmp_path / "b.json", n=10).read_text())["requests"]
    fit = [r for r in reqs if r["method"] != "rcllm"]
    rows, summary = validate_transfer(fit, reqs)
    rc = {r["fit"]: r for r in rows if r["method"] == "rcllm"}
    assert rc["per-method"]["n_fit"] == 0 and rc["per-method"]["median_rel_err"] is None
    assert rc["joint"]["n_test"] == 10 and rc["joint"]["median_rel_err"] is not None
    with pytest.raises(RcllmError, match="at least 4"):
        validate_transfer(fit[:2], reqs)


def test_validator_names_missing_fields(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"rows": [], "requests": [{"method": "full"}]}))
    with pytest.raises(RcllmError, match="lacks"):
        load_bench_requests(str(path))
    path.write_text(json.dumps({"rows": [{"method": "full", "ttft_p50_ms": 1.0}]}))
    with pytest.raises(RcllmError, match="requests"):
        load_bench_requests(str(path))


DATA = Path(__file__).parent / "data"
MAGAZINE, GIFT_CARDS = DATA / "ttft_magazine_cpu.json", DATA / "ttft_giftcards_cpu.json"


@pytest.mark.parametrize("fit_path,test_path", [(MAGAZINE, GIFT_CARDS), (GIFT_CARDS, MAGAZINE)])
def test_real_runs_fit_on_one_category_predict_the_other(fit_path, test_path):
    """Recorded real `bench ttft` runs (SmolLM2 with the depth schedule, prompt version 2, 1
    thread on a quiet 2-core machine, 2026-12-04; per request and variant the fastest of three
    runs, in the runs' speed-reference units): the profile fitted on one category predicts the
    other (other users, prompt lengths and, on Gift Cards, one review per request computed on
    the spot). Measured worst joint median error: 0.042 (Magazine -> Gift Cards), 0.057
    (Gift Cards -> Magazine)."""
    fit, test = load_bench_requests(str(fit_path)), load_bench_requests(str(test_path))
    rows, summary = validate_transfer(fit, test)
    joint = {r["method"]: r for r in rows if r["fit"] == "joint"}
    assert set(joint) == {"full", "prefix", "naive", "epic", "cacheblend", "rcllm"}
    for r in joint.values():   # every method fitted on one run, tested on all of the other
        assert r["n_fit"] == sum(q["method"] == r["method"] for q in fit)
        assert r["n_test"] == sum(q["method"] == r["method"] for q in test)
    assert summary["worst_median_rel_err_joint_fit"] <= 0.10
    normalized = [r for r in rows if r["fit"] == "joint/full-normalized" and r["n_test"]]
    assert len(normalized) == 5
    assert summary["worst_median_rel_err_full_normalized"] <= 0.10


def test_validate_cli_on_recorded_runs(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["sim", "validate", "--fit-json", str(MAGAZINE), "--bench-json",
                 f"{GIFT_CARDS},{GIFT_CARDS}", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["name"] == "sim.validate" and report["config"]["fit_json"] == str(MAGAZINE)
    assert len(report["rows"]) == 6 * 3
    assert "fitted on" in capsys.readouterr().out
    # a repeat of the same records changes nothing (min of identical values)
    one = validate_transfer(load_bench_requests(str(MAGAZINE)), load_bench_requests(str(GIFT_CARDS)))
    assert report["summary"]["worst_median_rel_err_joint_fit"] == pytest.approx(
        one[1]["worst_median_rel_err_joint_fit"])
    # two merged copies: every record was measured twice, never three times
    assert main(["sim", "validate", "--bench-json", f"{GIFT_CARDS},{GIFT_CARDS}",
                 "--min-repeats", "3"]) == 2
    assert "3 runs" in capsys.readouterr().err


def test_combine_repeats_keeps_the_fastest_and_rejects_other_requests():
    a = [{"user_id": "u", "variant": "full", "method": "full", "context_tokens": 10,
          "recomputed_tokens": 10, "ttft_ms": 5.0}]
    b = [dict(a[0], ttft_ms=4.0)]
    merged = combine_repeats([a, b])
    assert merged == [dict(b[0], repeats=2)]
    with pytest.raises(RcllmError, match="disagree"):
        combine_repeats([a, [dict(a[0], context_tokens=11)]])
