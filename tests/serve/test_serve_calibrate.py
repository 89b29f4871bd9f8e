"""The router's speed profile fitted to the served model (here the tiny 3-layer model, far
faster than the SmolLM2 CPU profile the router used to assume for every model)."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.config import RcllmConfig
from rcllm.engine import Engine
from rcllm.errors import RcllmError
from rcllm.routing import cpu_smollm2_profile
from rcllm.routing.fit import predict_ms
from rcllm.serve.calibrate import (calibration_points, fit_served_profile, load_profile,
                                   save_profile, served_model_spec)


def _rel_error(profile, points) -> float:
    got = np.array([float(predict_ms(profile, m, np.array([c]), np.array([n]))[0])
                    for c, n, _ms, m in points])
    ms = np.array([p[2] for p in points])
    return float(np.median(np.abs(got - ms) / ms))


def test_calibrated_profile_fits_the_served_model(tiny_loaded, synthetic, tmp_path):
    engine = Engine(tiny_loaded, dict(synthetic.items), RcllmConfig())
    spec = served_model_spec(engine)
    assert (spec.num_layers, spec.kv_dtype_bytes) == (tiny_loaded.model.arch.num_layers, 4)
    points = calibration_points(engine, synthetic, cases=3, repeats=4)
    assert len(points) == 6 and [p[3] for p in points] == ["full", "rcllm"] * 3
    # the rcllm run reuses chunks: it computes fewer tokens than the full one of the request
    assert all(points[k + 1][0] < points[k][0] for k in range(0, 6, 2))
    fitted = fit_served_profile(points, spec)
    assert fitted.model == spec and fitted.name.endswith("@calibrated")
    # the fitted profile reproduces the served model's measured TTFTs, the SmolLM2 profile
    # does not (in-sample: timings on this shared machine swing several-fold between runs
    # minutes apart, so a comparison with later measurements would test the machine)
    fit_err, base_err = _rel_error(fitted, points), _rel_error(cpu_smollm2_profile(), points)
    print(f"median relative TTFT error: fitted {fit_err:.2f}, SmolLM2 CPU profile {base_err:.2f}")
    assert fit_err < 0.75 and fit_err < base_err, (points, fitted)
    full, warm = points[0], points[1]      # one request: full vs rcllm
    assert (float(predict_ms(fitted, "full", np.array([full[0]]), np.array([full[1]]))[0])
            > float(predict_ms(fitted, "rcllm", np.array([warm[0]]), np.array([warm[1]]))[0]))
    save_profile(fitted, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == fitted
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(RcllmError, match="not a saved speed profile"):
        load_profile(tmp_path / "bad.json")
