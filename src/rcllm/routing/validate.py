"""Validating the cost model against the real engine's measured TTFTs.

Input: the JSON written by `rcllm bench ttft --json` — `rows` with `method` and `ttft_p50_ms`,
and per-request details under `requests` (top level, or inside `summary`/each row as a
fallback): {"method", "context_tokens", "recomputed_tokens", "reused_tokens", "ttft_ms"}.
Two protocols:

- `validate_transfer(fit_reqs, test_reqs)` (the real check): the profile is fitted on every
  record of one run and predicts every record of another run (another category, other ratios,
  other machine load);
- `validate(reqs, seed)`: per method the requests of one run are shuffled with a seeded
  generator and split in half; the profile is fitted on the first halves and predicts the
  second. A method with a single record has nothing held out: its row has `n_test = 0` and no
  error (it is never tested on its own training point) and it does not count in the worst.

Two fits are reported: `per-method` (one profile per method, when it has at least 4 fitting
records, else the joint one) and `joint` (compute coefficients shared, reuse cost per method —
the single profile the simulator uses). A third row per method, `joint/full-normalized`, scores
the joint profile's *speedup over full on the same request* (predicted time of the method /
predicted time of full, against the measured ratio; records are paired by `user_id`): it
cancels the machine's speed at the moment the request ran, which on a shared machine drifts by
tens of percent within one run while the methods of a request run back to back.

Speed reference: `bench ttft` times a fixed forward pass before and after its requests
(`summary.reference_ms`, `model.reference`). When every record of the fit and of the test runs
carries its run's reference, each time is put in the units of the fit runs' median reference
(`ttft_ms · R_fit / R_run`) before fitting and scoring, so a machine that was uniformly slower
during one run is not read as a cost of that run's requests (the simulator's sweep prediction
scales its cells the same way). Repeated runs are merged on the scaled times.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import RcllmError, read_json_file
from .fit import fit_cpu_profile, predict_ms

REQUIRED = ("method", "context_tokens", "recomputed_tokens", "ttft_ms")
TARGET_MEDIAN_REL_ERR = 0.10


def load_bench_requests(path: str) -> list[dict[str, Any]]:
    """The per-request records of a bench JSON; RcllmError names what is missing."""
    data = read_json_file(path, f"bench JSON not found: {path}", path)
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
    refs = (data.get("summary") or {}).get("reference_ms") or data.get("reference_ms")
    if refs:  # the run's speed: the mean of its reference passes (before and after)
        ref = float(np.mean(refs))
        reqs = [{**r, "run_reference_ms": ref} for r in reqs]
    return reqs


def scaled_ttft(r: dict[str, Any], unit_ms: float) -> float:
    """A record's TTFT in units of `unit_ms` of reference time: ttft · unit / its run's
    reference (what a run on a machine of that speed would have measured)."""
    return r["ttft_ms"] * unit_ms / r["run_reference_ms"]


def reference_scaled(reqs: list[dict[str, Any]], unit_ms: float) -> list[dict[str, Any]]:
    """The records with `ttft_ms` scaled to `unit_ms` (`scaled_ttft`; `ttft_raw_ms` keeps the
    measured value)."""
    return [{**r, "ttft_raw_ms": r["ttft_ms"], "ttft_ms": scaled_ttft(r, unit_ms)} for r in reqs]


def has_reference(*runs: list[dict[str, Any]]) -> bool:
    return all(r.get("run_reference_ms") for run in runs for r in run) and any(runs)


def merged_records(paths: list[str], min_repeats: int) -> list[dict[str, Any]]:
    """The records of repeated bench runs of the same requests (`combine_repeats`), kept when
    measured in at least `min_repeats` of them (a record without repeats counts once)."""
    runs = [load_bench_requests(p) for p in paths]
    if len(runs) > 1 and has_reference(*runs):  # the fastest run once the machine's speed is out
        unit = float(np.median([r["run_reference_ms"] for run in runs for r in run]))
        runs = [[{**r, "merge_ms": scaled_ttft(r, unit)} for r in run] for run in runs]
    merged = combine_repeats(runs)
    return [r for r in merged if r.get("repeats", 1) >= min_repeats]


def combine_repeats(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Records of repeated runs of the same requests, merged: per (user_id, variant) the
    record with the smallest TTFT (the run least disturbed by other work on the machine), with
    `repeats` = how many runs measured it. Records without a user_id are kept as they are."""
    best: dict[tuple, dict] = {}
    loose = []
    for run in runs:
        for r in run:
            if "user_id" not in r:
                loose.append(r)
                continue
            key = (r["user_id"], r.get("variant", r["method"]))
            old = best.get(key)
            if old is not None and (old["context_tokens"], old["recomputed_tokens"]) != (
                    r["context_tokens"], r["recomputed_tokens"]):
                raise RcllmError(f"repeated runs disagree on the request of {key}: not the "
                                 "same requests or settings")
            n = (old or {}).get("repeats", 0) + 1
            if old is None or r.get("merge_ms", r["ttft_ms"]) < old.get("merge_ms",
                                                                      old["ttft_ms"]):
                best[key] = dict(r)
            best[key]["repeats"] = n
    return list(best.values()) + loose


def _by_method(reqs: list[dict]) -> dict[str, list[dict]]:
    return {m: [r for r in reqs if r["method"] == m] for m in sorted({r["method"] for r in reqs})}


def _split(reqs: list[dict], seed: int) -> tuple[dict, dict]:
    """Per method, a seeded half for fitting and the rest for testing (possibly empty)."""
    rng = np.random.default_rng(seed)
    fit, test = {}, {}
    for method, mine in _by_method(reqs).items():
        order = rng.permutation(len(mine))
        half = max(1, len(mine) // 2)
        fit[method] = [mine[i] for i in order[:half]]
        test[method] = [mine[i] for i in order[half:]]
    return fit, test


def _points(reqs: list[dict]) -> list[tuple[int, int, float]]:
    return [(int(r["recomputed_tokens"]), int(r["context_tokens"]), float(r["ttft_ms"]))
            for r in reqs]


def validate(reqs: list[dict[str, Any]], seed: int = 0) -> tuple[list[dict], dict]:
    """Split-half within one run: rows (one per fit × method) and a summary."""
    fit, test = _split(reqs, seed)
    return _evaluate(fit, test, [r for r in reqs if r["method"] == "full"])


def validate_transfer(fit_reqs: list[dict[str, Any]], test_reqs: list[dict[str, Any]],
                      speed_reference: bool = True) -> tuple[list[dict], dict]:
    """Fitted on every record of one run, tested on every record of another run; with
    `speed_reference` and a reference on every record, times are scaled by it (module doc)."""
    scaled = speed_reference and has_reference(fit_reqs, test_reqs)
    if scaled:
        unit = float(np.median([r["run_reference_ms"] for r in fit_reqs]))
        fit_reqs, test_reqs = reference_scaled(fit_reqs, unit), reference_scaled(test_reqs, unit)
    fit, test = _by_method(fit_reqs), _by_method(test_reqs)
    for method in test:
        fit.setdefault(method, [])
    rows, summary = _evaluate(fit, test, test.get("full", []))
    return rows, {**summary, "speed_reference": scaled}


def _full_normalized(joint, test: dict[str, list[dict]], reference: list[dict]) -> list[dict]:
    """Rows scoring the joint profile's speedup over `full` on the same request.

    `reference`: the `full` records of the run the test records come from (a reference, not a
    fitting point: the method's prediction is divided by full's *predicted* time)."""
    full = {r["user_id"]: r for r in reference if "user_id" in r}
    if not full:
        return []
    base = {u: float(predict_ms(joint, "full", [r["recomputed_tokens"]], [r["context_tokens"]])[0])
            for u, r in full.items()}
    rows = []
    for method, recs in test.items():
        pairs = [r for r in recs if r.get("user_id") in full] if method != "full" else []
        row = {"fit": "joint/full-normalized", "method": method, "n_fit": None,
               "n_test": len(pairs), "median_rel_err": None, "p90_rel_err": None,
               "measured_p50_ms": None, "predicted_p50_ms": None}
        if pairs:
            t = np.array(_points(pairs), float)
            measured = t[:, 2] / np.array([full[r["user_id"]]["ttft_ms"] for r in pairs])
            pred = (predict_ms(joint, method, t[:, 0], t[:, 1])
                    / np.array([base[r["user_id"]] for r in pairs]))
            rel = np.abs(pred - measured) / measured
            row.update({"median_rel_err": float(np.median(rel)),
                        "p90_rel_err": float(np.percentile(rel, 90)),
                        "measured_p50_speedup": float(np.median(1 / measured)),
                        "predicted_p50_speedup": float(np.median(1 / pred))})
        rows.append(row)
    return rows


def _evaluate(fit: dict[str, list[dict]], test: dict[str, list[dict]],
              reference: list[dict]) -> tuple[list[dict], dict]:
    joint_pts = [p for m in fit for p in _points(fit[m])]
    joint_methods = [m for m in fit for _ in fit[m]]
    if len(joint_pts) < 4:
        raise RcllmError("validation needs at least 4 fitting requests")
    joint = fit_cpu_profile(joint_pts, joint_methods)
    rows = []
    for method in fit:
        pts = _points(fit[method])
        own = fit_cpu_profile(pts, [method] * len(pts)) if len(pts) >= 4 else joint
        t = np.array(_points(test.get(method, [])), float).reshape(-1, 3)
        for kind, prof in (("per-method", own), ("joint", joint)):
            row = {"fit": kind, "method": method, "n_fit": len(pts), "n_test": len(t),
                   "median_rel_err": None, "p90_rel_err": None, "measured_p50_ms": None,
                   "predicted_p50_ms": None}
            if len(t) and (len(pts) or kind == "joint"):
                # a method never seen in fitting has no reuse cost of its own: not predicted
                # by a per-method fit; the joint fit predicts it with reuse cost 0
                pred = predict_ms(prof, method, t[:, 0], t[:, 1])
                rel = np.abs(pred - t[:, 2]) / t[:, 2]
                row.update({"median_rel_err": float(np.median(rel)),
                            "p90_rel_err": float(np.percentile(rel, 90)),
                            "measured_p50_ms": float(np.median(t[:, 2])),
                            "predicted_p50_ms": float(np.median(pred))})
            rows.append(row)
    rows += _full_normalized(joint, test, reference)
    tested = [r for r in rows if r["median_rel_err"] is not None
              and r["fit"] in ("per-method", "joint")]
    if not tested:
        raise RcllmError("no method has a test record apart from its fitting records")
    worst = {k: max((r["median_rel_err"] for r in tested if r["fit"] == k), default=None)
             for k in ("per-method", "joint")}
    normalized = [r["median_rel_err"] for r in rows
                  if r["fit"] == "joint/full-normalized" and r["median_rel_err"] is not None]
    summary = {"worst_median_rel_err_per_method_fit": worst["per-method"],
               "worst_median_rel_err_joint_fit": worst["joint"],
               "worst_median_rel_err_full_normalized": max(normalized, default=None),
               "untested_methods": sorted({r["method"] for r in rows} -
                                          {r["method"] for r in tested}),
               "target": TARGET_MEDIAN_REL_ERR,
               "pass_joint": worst["joint"] is not None and worst["joint"] <= TARGET_MEDIAN_REL_ERR,
               "joint_profile": {"fixed_ms": joint.fixed_ms, "ms_per_token": joint.ms_per_token,
                                 "ms_per_token_ctx": joint.ms_per_token_ctx,
                                 "reuse_ms_per_token": dict(joint.reuse_ms_per_token)}}
    return rows, summary
