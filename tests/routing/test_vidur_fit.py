import os

import pytest

from rcllm.routing.vidur_fit import BAKED, DEFAULT_DIR, builtin_profile, fit_all

pytestmark = pytest.mark.skipif(not os.path.isdir(DEFAULT_DIR),
                                reason="../shared/data/vidur-profiles is absent")


def test_fit_matches_baked_profiles():
    fits = fit_all()
    assert set(fits) == set(BAKED)
    for key, (fit, prof) in fits.items():
        eff, intercept = BAKED[key]
        assert fit.efficiency == pytest.approx(eff, abs=1e-3)
        assert fit.intercept_ms == pytest.approx(intercept, abs=1e-3)
        assert 0.3 < fit.efficiency < 1.0 and fit.rows >= 100
        assert prof.ms_per_token == pytest.approx(builtin_profile(key).ms_per_token, rel=1e-3)


def test_h100_is_faster_and_72b_slower():
    p = {k: builtin_profile(k).full_prefill_ms(2048) for k in BAKED}
    assert p["qwen3-8b@h100"] < p["qwen3-8b@a100"] < p["qwen-72b@a100"]
    assert p["qwen-72b@h100"] < p["qwen-72b@a100"]
