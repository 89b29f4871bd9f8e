"""The router's speed profile fitted to the served model (here the tiny 3-layer model, far
faster than the SmolLM2 CPU profile the router used to assume for every model)."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.config import RcllmConfig
from rcllm.engine import Engine
from rcllm.errors import RcllmError
from rcllm.schedule import cpu_smollm2_profile
from rcllm.schedule.fit import predict_ms
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
    points = calibration_points(engine, synthetic, cases=3)
    assert len(points) == 9 and {p[3] for p in points} == {"full", "rcllm"}
    # the warm rcllm run computes fewer tokens than the full one of the same request
    assert all(points[k + 2][0] < points[k][0] for k in range(0, 9, 3))
    fitted = fit_served_profile(points, spec)
    assert fitted.model == spec and fitted.name.endswith("@calibrated")
    # points measured after the fit (a fresh engine, same requests): the fitted profile
    # predicts them far better than the unfitted SmolLM2 profile
    fresh = calibration_points(Engine(tiny_loaded, dict(synthetic.items), RcllmConfig()),
                               synthetic, cases=3)
    fit_err, base_err = _rel_error(fitted, fresh), _rel_error(cpu_smollm2_profile(), fresh)
    print(f"median relative TTFT error: fitted {fit_err:.2f}, SmolLM2 CPU profile {base_err:.2f}")
    assert fit_err < 1.0 and fit_err < base_err / 3
    save_profile(fitted, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == fitted
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(RcllmError, match="not a saved speed profile"):
        load_profile(tmp_path / "bad.json")
