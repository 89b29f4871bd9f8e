import json

import numpy as np
import pytest

from rcllm.cli import main
from rcllm.errors import RcllmError
from rcllm.schedule.fit import fit_cpu_profile, predict_ms
from rcllm.schedule.validate import load_bench_requests, validate

TRUE = {"fixed": 30.0, "per_token": 2.0, "per_pair": 4e-4,
        "reuse": {"full": 0.0, "prefix": 0.01, "rcllm": 0.15}}


def _measured(method, computed, context):
    return (TRUE["fixed"] + computed * (TRUE["per_token"] + TRUE["per_pair"] * context)
            + TRUE["reuse"][method] * (context - computed))


def _bench_json(path, n=60, noise=0.03, seed=0):
    """A file shaped like `rcllm bench ttft --json` output, from a known engine + noise."""
    rng = np.random.default_rng(seed)
    reqs = []
    for method in ("full", "prefix", "rcllm"):
        for _ in range(n):
            ctx = int(rng.integers(800, 3000))
            comp = {"full": ctx, "prefix": ctx - 200,
                    "rcllm": int(ctx * rng.uniform(0.3, 0.6))}[method]
            ms = _measured(method, comp, ctx) * (1 + rng.normal(0, noise))
            reqs.append({"method": method, "context_tokens": ctx, "recomputed_tokens": comp,
                         "reused_tokens": ctx - comp, "ttft_ms": ms})
    rows = [{"method": m, "ttft_p50_ms": float(np.median([r["ttft_ms"] for r in reqs
                                                          if r["method"] == m]))}
            for m in ("full", "prefix", "rcllm")]
    path.write_text(json.dumps({"name": "bench.ttft", "config": {}, "rows": rows,
                                "summary": {}, "requests": reqs}))
    return path


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


def test_validator_on_generated_bench_json(tmp_path):
    rows, summary = validate(load_bench_requests(str(_bench_json(tmp_path / "b.json"))))
    assert {r["method"] for r in rows} == {"full", "prefix", "rcllm"}
    assert all(r["n_fit"] == 30 and r["n_test"] == 30 for r in rows)
    assert summary["worst_median_rel_err_joint_fit"] < 0.05   # noise is 3%
    assert summary["pass_joint"] is True


def test_validate_cli_writes_report(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["sim", "validate", "--bench-json", str(_bench_json(tmp_path / "b.json")),
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["name"] == "sim.validate" and len(report["rows"]) == 6
    assert "median relative error" in capsys.readouterr().out


def test_validator_names_missing_fields(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"rows": [], "requests": [{"method": "full"}]}))
    with pytest.raises(RcllmError, match="lacks"):
        load_bench_requests(str(path))
    path.write_text(json.dumps({"rows": [{"method": "full", "ttft_p50_ms": 1.0}]}))
    with pytest.raises(RcllmError, match="requests"):
        load_bench_requests(str(path))
