"""Fitting a CPU speed profile to measured prefill times.

Model (per request, no queue): ms = fixed + a·computed + b·computed·context + c_m·reused,
reused = context − computed and c_m the per-reused-token cost of method m (KV assembly,
re-rotation, RcLLM's full first layer). Coefficients are non-negative; rows are divided by the
measured time so the fit minimises relative error, the error the validation reports.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import RcllmError
from .profiles import SpeedProfile, cpu_smollm2_profile

Point = tuple[int, int, float]   # (computed tokens, context tokens, measured ms)


def _design(points: np.ndarray, method_idx: np.ndarray, num_methods: int) -> np.ndarray:
    r, c = points[:, 0], points[:, 1]
    cols = [np.ones_like(r), r, r * c]
    for m in range(num_methods):
        cols.append(np.where(method_idx == m, c - r, 0.0))
    return np.stack(cols, axis=1)


def relative_nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients of `x @ coef ≈ y` minimising the relative error (each row
    divided by its measured `y`), the error the validations report."""
    from scipy.optimize import nnls  # scipy is a dependency; imported here to keep import light

    scale = 1.0 / y
    return nnls(x * scale[:, None], y * scale)[0]


def fit_cpu_profile(points: Sequence[Point], methods: Sequence[str] | None = None,
                    base: SpeedProfile | None = None) -> SpeedProfile:
    """Fits fixed_ms, ms_per_token, ms_per_token_ctx and per-method reuse cost.

    `methods`, aligned with `points`, names the method of each point: compute coefficients are
    shared and each method gets its own reuse cost. Without it one reuse cost is fitted and
    given to 'prefix' and 'rcllm'. Raises RcllmError on fewer than 4 points or bad values.
    """
    arr = np.asarray(points, dtype=float)
    if arr.ndim != 2 or arr.shape[1] != 3 or len(arr) < 4:
        raise RcllmError("fit_cpu_profile needs at least 4 (computed, context, ms) points")
    if np.any(arr[:, 2] <= 0) or np.any(arr[:, 0] < 0) or np.any(arr[:, 0] > arr[:, 1]):
        raise RcllmError("points need ms > 0 and 0 <= computed <= context")
    names = sorted(set(methods)) if methods is not None else ["*"]
    idx = (np.array([names.index(m) for m in methods]) if methods is not None
           else np.zeros(len(arr), int))
    coef = relative_nnls(_design(arr, idx, len(names)), arr[:, 2])
    reuse = {m: float(coef[3 + i]) for i, m in enumerate(names)}
    if methods is None:
        reuse = {"prefix": reuse["*"], "rcllm": reuse["*"]}
    base = base or cpu_smollm2_profile()
    return base.replace(name=base.name + "+fit", fixed_ms=float(coef[0]),
                        ms_per_token=float(coef[1]), ms_per_token_ctx=float(coef[2]),
                        reuse_ms_per_token=reuse)


def predict_ms(profile: SpeedProfile, method: str, computed: np.ndarray,
               context: np.ndarray) -> np.ndarray:
    """Service time the profile predicts (no queue, no transfer: KV is in host memory)."""
    computed = np.asarray(computed, float)
    context = np.asarray(context, float)
    reuse = profile.reuse_ms_per_token.get(method, 0.0)
    return (profile.fixed_ms + computed * (profile.ms_per_token
                                           + profile.ms_per_token_ctx * context)
            + reuse * (context - computed))
