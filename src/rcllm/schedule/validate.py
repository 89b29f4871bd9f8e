"""Validating the cost model against the real engine's measured TTFTs.

Input: the JSON written by `rcllm bench ttft --json` — `rows` with `method` and `ttft_p50_ms`,
and per-request details under `requests` (top level, or inside `summary`/each row as a
fallback): {"method", "context_tokens", "recomputed_tokens", "reused_tokens", "ttft_ms"}.
Per method the requests are shuffled with a seeded generator and split in half; the profile is
fitted on the first halves and predicts the second. Two fits are reported: `per-method` (one
profile per method) and `joint` (compute coefficients shared, reuse cost per method — the single
profile the simulator uses).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import RcllmError
from .fit import fit_cpu_profile, predict_ms

REQUIRED = ("method", "context_tokens", "recomputed_tokens", "ttft_ms")
TARGET_MEDIAN_REL_ERR = 0.10


def load_bench_requests(path: str) -> list[dict[str, Any]]:
    """The per-request records of a bench JSON; RcllmError names what is missing."""
    if not os.path.exists(path):
        raise RcllmError(f"bench JSON not found: {path}")
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise RcllmError(f"{path} is not JSON: {exc}") from None
    reqs = data.get("requests") or (data.get("summary") or {}).get("requests")
    if not reqs:
        reqs = [r for row in data.get("rows", []) for r in row.get("requests", [])]
    if not reqs:
        raise RcllmError(f"{path} has no per-request records under 'requests' "
                         "(run `rcllm bench ttft --json PATH`)")
    for i, r in enumerate(reqs):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise RcllmError(f"{path}: request {i} lacks {', '.join(missing)}")
    return reqs


def _split(reqs: list[dict], seed: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    fit, test = {}, {}
    for method in sorted({r["method"] for r in reqs}):
        mine = [r for r in reqs if r["method"] == method]
        order = rng.permutation(len(mine))
        half = max(1, len(mine) // 2)
        fit[method] = [mine[i] for i in order[:half]]
        test[method] = [mine[i] for i in order[half:]] or fit[method]
    return fit, test


def _points(reqs: list[dict]) -> list[tuple[int, int, float]]:
    return [(int(r["recomputed_tokens"]), int(r["context_tokens"]), float(r["ttft_ms"]))
            for r in reqs]


def validate(reqs: list[dict[str, Any]], seed: int = 0) -> tuple[list[dict], dict]:
    """Rows (one per fit × method) and a summary with the worst median relative error."""
    fit, test = _split(reqs, seed)
    joint_pts = [p for m in fit for p in _points(fit[m])]
    joint_methods = [m for m in fit for _ in fit[m]]
    if len(joint_pts) < 4:
        raise RcllmError("validation needs at least 8 requests")
    joint = fit_cpu_profile(joint_pts, joint_methods)
    rows = []
    for method in fit:
        pts = _points(fit[method])
        own = fit_cpu_profile(pts, [method] * len(pts)) if len(pts) >= 4 else joint
        t = np.array(_points(test[method]), float)
        for kind, prof in (("per-method", own), ("joint", joint)):
            pred = predict_ms(prof, method, t[:, 0], t[:, 1])
            rel = np.abs(pred - t[:, 2]) / t[:, 2]
            rows.append({"fit": kind, "method": method, "n_fit": len(pts), "n_test": len(t),
                         "median_rel_err": float(np.median(rel)),
                         "p90_rel_err": float(np.percentile(rel, 90)),
                         "measured_p50_ms": float(np.median(t[:, 2])),
                         "predicted_p50_ms": float(np.median(pred))})
    worst = {k: max(r["median_rel_err"] for r in rows if r["fit"] == k)
             for k in ("per-method", "joint")}
    summary = {"worst_median_rel_err_per_method_fit": worst["per-method"],
               "worst_median_rel_err_joint_fit": worst["joint"],
               "target": TARGET_MEDIAN_REL_ERR,
               "pass_joint": worst["joint"] <= TARGET_MEDIAN_REL_ERR,
               "joint_profile": {"fixed_ms": joint.fixed_ms, "ms_per_token": joint.ms_per_token,
                                 "ms_per_token_ctx": joint.ms_per_token_ctx,
                                 "reuse_ms_per_token": dict(joint.reuse_ms_per_token)}}
    return rows, summary
