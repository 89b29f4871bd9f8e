"""The simulator's prediction of a served sweep (`rcllm bench serve --sweep`; issue 30 item 2).

Input: the sweep's JSON (each cell's arrival times and, per request, the method the engine ran,
its prompt tokens and the tokens it computed, and the instance the router chose) and a speed
profile fitted on a *separate* `rcllm bench ttft` run (`routing.fit.fit_cpu_profile`, the
joint fit of `rcllm sim validate`: shared compute terms, one reuse cost per method). Never
fitted on the sweep: the sweep gives the workload (arrival times and request shapes), not
times.

Model of the served cluster: K instances, each one FIFO server running one engine call at a
time (the Ray actor's engine lock; `model.threads=1`); a request's service time is the
profile's prefill time of its (computed, context) tokens plus `overhead_ms` (HTTP + router,
default 0); TTFT = arrival to the end of service. Routing:
- `replay` (default): each request goes where the served router sent it. The policies'
  decisions are then not a source of error, and what is left is the cost model and queueing.
- `policy`: the cache-blind policies (`routing.registry.CACHE_BLIND`) simulated — load-only =
  the instance with the least predicted outstanding work, round-robin = arrival order mod K;
  the rest need the served caches' contents, which the sweep
  does not record, so they are replayed (the report says which cells were).

Work behind the answers: each request's `behind_tokens` (the chunk builds and the exact user
side its instance queued after answering, recorded by the engine) run on that instance's builder
thread, one job at a time, priced by the chunk builds the fit run timed (`fit_behind`: a fixed
cost per job plus one per token; runs recorded before builds were timed price a job as a plain
forward pass, `behind_ms`); the engines and busy builders share the sweep machine's cores
(processor sharing weighted by CPU weight: a builder at the sweep's `behind_nice` weighs
`behind_weight` of an engine thread). Sweeps recorded before `behind_tokens` existed are predicted without it
(the summary says so).

What the model leaves out (the comparison shows how much it matters): the router's CPU, Redis
fetches, queueing in Ray before the actor, and a relay's prewarms (`bench serve --sweep
--relay-lead-s`: their engine time is not replayed; the summary counts them,
`relay_prewarms_left_out`).

The comparison's outputs (JSON, table, figure) are written by sim/served_report.py.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from ..errors import RcllmError
from ..routing.fit import fit_cpu_profile, predict_ms, relative_nnls
from ..routing.profiles import SpeedProfile
from ..routing.registry import CACHE_BLIND
from .served_cluster import ServedCluster, core_shares  # noqa: F401 (core_shares: read as served's)
from .slowdown import slowdown_of


def load_sweep(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        raise RcllmError(f"sweep JSON not found: {path}")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    # a stopped sweep's sweep.partial.json (its cells so far) is accepted too; files written
    # before it carried the name hold only capacity_rps and cells
    partial = "name" not in data and "capacity_rps" in data
    if (data.get("name") != "bench.serve.sweep" and not partial) or not data.get("cells"):
        raise RcllmError(f"{path} is not a `rcllm bench serve --sweep` report with cells")
    for c in data["cells"]:
        for r in c["requests"]:
            if r["status"] == 200 and "context_tokens" not in r:
                raise RcllmError(f"{path}: requests lack context_tokens (a sweep recorded "
                                 "before they were; run it again)")
    return data


def fit_profile(fit_requests: list[dict]) -> SpeedProfile:
    """The joint profile of a bench ttft run's records (`rcllm sim validate`'s joint fit)."""
    pts = [(int(r["recomputed_tokens"]), int(r["context_tokens"]), float(r["ttft_ms"]))
           for r in fit_requests]
    return fit_cpu_profile(pts, [r["method"] for r in fit_requests])


def service_ms(profile: SpeedProfile, method: str, computed: float, context: float,
               overhead_ms: float = 0.0) -> float:
    """One request's predicted engine time; a method the fit never saw is priced as rcllm."""
    m = method if method in profile.reuse_ms_per_token else "rcllm"
    return float(predict_ms(profile, m, np.array([computed]), np.array([context]))[0]
                 + overhead_ms)


BehindCost = tuple  # (fixed ms per job, ms per computed token): fitted on measured builds


def fit_behind(builds: list) -> BehindCost | None:
    """The cost of a job behind an answer, fitted on chunk builds a `bench ttft` run timed
    (its summary's `chunk_builds`: [computed, context, ms] each): a fixed cost per job (one
    forward call through every layer, whatever its size) plus a cost per computed token,
    non-negative, least relative error. None with fewer than 4 builds."""
    arr = np.asarray(builds, float).reshape(-1, 3)
    arr = arr[arr[:, 2] > 0]
    if len(arr) < 4:
        return None
    coef = relative_nnls(np.stack([np.ones(len(arr)), arr[:, 0]], axis=1), arr[:, 2])
    return float(coef[0]), float(coef[1])


def speed_scale(cell: Mapping[str, Any], fit_reference_ms: float | None) -> float:
    """How much slower the machine ran a cell than the fit run: the cell's reference pass
    (its instances', timed one at a time before the cell) over the fit run's. 1 when either
    was not timed (runs recorded before 2026-12-04)."""
    ref = cell.get("reference_ms")
    if not ref or not fit_reference_ms:
        return 1.0
    return float(np.median(ref)) / fit_reference_ms


def load_fit_extras(paths: list[str]) -> tuple[list, float | None]:
    """What a fit run's summary says besides its requests, each file read once: the chunk
    builds it timed (`chunk_builds`, [computed, context, ms] each; none in runs recorded before
    they were) and its speed reference (`reference_ms`, the mean of every run's passes; None
    when a run predates it)."""
    builds, refs, every = [], [], True
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            summary = json.load(fh).get("summary") or {}
        builds += summary.get("chunk_builds") or []
        refs += summary.get("reference_ms") or []
        every = every and bool(summary.get("reference_ms"))
    return builds, (float(np.mean(refs)) if every and refs else None)


def behind_ms(profile: SpeedProfile, computed: float, context: float,
              cost: BehindCost | None = None) -> float:
    """A job run behind an answer (a chunk build, the exact user side). With `cost` (fitted on
    measured builds, `fit_behind`): fixed + per computed token. Without: a plain forward pass
    of `computed` tokens over `context` priced by the profile's compute terms, no fixed cost
    (what sweeps were predicted with before builds were timed; it leaves out the per-call cost
    of running every layer, which dominates a 16–32-token chunk)."""
    if cost is not None:
        return float(cost[0] + cost[1] * computed)
    return float(computed * (profile.ms_per_token + profile.ms_per_token_ctx * context))


# Linux CFS's weight of a thread per niceness 0..19 (kernel/sched/core.c sched_prio_to_weight)
CFS_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
               110, 87, 70, 56, 45, 36, 29, 23, 18, 15)


def behind_weight(nice: int) -> float:
    """The CPU weight of a builder thread at `nice` relative to an engine thread at 0."""
    return CFS_WEIGHTS[max(0, min(19, int(nice)))] / CFS_WEIGHTS[0]


def simulate_cell(*args, **kwargs) -> tuple[np.ndarray, np.ndarray, bool]:
    """Predicted TTFT (ms) and service time (ms) of a cell's answered requests, and whether
    the policy's own decisions were simulated (False: replayed): `simulate_engine`'s first
    three (same arguments)."""
    return simulate_engine(*args, **kwargs)[:3]


def simulate_engine(arrivals_s: list[float], requests: list[dict], profile: SpeedProfile,
                    instances: int, policy: str, routing: str = "replay",
                    overhead_ms: float = 0.0,
                    busy_slowdown: float | Mapping[str, float] = 1.0,
                    cores: float | None = None, behind_cost: BehindCost | None = None,
                    scale: float = 1.0, measured: bool = False, builder_weight: float = 1.0
                    ) -> tuple[np.ndarray, np.ndarray, bool, np.ndarray]:
    """Predicted TTFT (ms) and service time (ms) of a cell's answered requests, whether the
    policy's own decisions were simulated (False: replayed), and each answered request's
    predicted engine time (ms from the start of its service to its end: what the served engine
    records as its TTFT, core waits included).

    Each instance serves its FIFO queue one request at a time. `busy_slowdown` F: while two or
    more threads compute at once, each progresses at 1/F of its speed alone (they share the
    machine's cores and memory bandwidth); F = 1 makes the instances independent. F may be
    per engine method (`slowdown_of`); behind work slows by the "*" value.
    `cores`: the work a request queued behind its answer (`behind_tokens`: chunk builds, the
    exact user side) runs on its instance's builder thread, one job at a time, beside the
    engine; with more busy threads than cores they share them by CPU weight (`core_shares`: an
    engine thread weighs 1, a builder `builder_weight`, `behind_weight` of the served
    `reuse.behind_nice`; at equal weights each gets cores/threads of one). None: behind
    work is left out (the model before it was recorded). `behind_cost`: `behind_ms`'s price of
    a job. `scale`: every engine and behind time is multiplied by it (`speed_scale`: the
    machine's speed during the cell against the fit run's). `measured`: each request's service
    is the engine TTFT the sweep measured for it (+ `overhead_ms`) instead of the profile's
    price — the queueing model with a perfect cost model (pass `scale` 1, F 1 and no `cores`:
    the measured times already hold the machine's speed and the contention)."""
    own = routing == "policy" and policy in CACHE_BLIND
    jobs = _jobs(arrivals_s, requests, profile, instances, overhead_ms, busy_slowdown, cores,
                 behind_cost, scale, measured)
    sim = ServedCluster(jobs, instances, cores, builder_weight, slowdown_of(busy_slowdown, "*"))
    while sim.pending():
        run, brun = sim.speeds()
        t_next = sim.advance(run, brun)
        sim.complete(run, brun)
        if t_next <= sim.t and sim.nxt < len(jobs):
            sim.arrive(sim.destination(own, policy))
    ttft = np.array([sim.done[i] - jobs[i][0] for i in range(len(jobs))])
    return (ttft, np.array([j[1] for j in jobs]), own,
            np.array([sim.done[i] - sim.began[i] for i in range(len(jobs))]))


def _jobs(arrivals_s, requests, profile, instances, overhead_ms, busy_slowdown, cores,
          behind_cost, scale, measured) -> list[tuple]:
    """`simulate_engine`'s answered requests, each (arrival ms, service ms, the instance the
    router chose, the ms of each job it queued behind its answer — none without `cores` —,
    its busy slowdown F)."""
    return [(at_s * 1e3, float(r["ttft_ms"]) + overhead_ms if measured else
             scale * service_ms(profile, r.get("method") or "rcllm", r["recomputed_tokens"],
                                r["context_tokens"], overhead_ms),
             int(r["instance"]) % instances,
             [scale * behind_ms(profile, n, ctx, behind_cost)
              for n, ctx in r.get("behind_tokens", [])]
             if cores else [],
             slowdown_of(busy_slowdown, r.get("method") or "rcllm"))
            for at_s, r in zip(arrivals_s, requests) if r["status"] == 200]


def engine_spans(requests: list[dict]) -> list[tuple[float, float, int]]:
    """(start ms, end ms, instance) of each request's engine call up to its first token, on the
    load generator's clock: the engine ran from (answer − total_ms) for ttft_ms, and the answer
    left at sent_s + latency_ms (the diagnostic scripts' common timeline)."""
    out = []
    for r in requests:
        start = r["sent_s"] * 1e3 + r["latency_ms"] - r["total_ms"]
        out.append((start, start + r["ttft_ms"], int(r["instance"])))
    return out


def overlap(span: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    """The fraction of `span` that `spans` cover (summed, at most 1)."""
    (s, e), covered = span, 0.0
    for s2, e2 in spans:
        covered += max(0.0, min(e, e2) - max(s, s2))
    return min(1.0, covered / max(1e-9, e - s))


def _rel(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas if meas > 0 else float("nan")


def sweep_instances(sweep: dict[str, Any]) -> int:
    """The instance count a sweep served with (older partial files: the instances used)."""
    return int(sweep.get("instances") or 1 + max(
        int(r["instance"]) for c in sweep["cells"] for r in c["requests"] if "instance" in r))


def predict_sweep(sweep: dict[str, Any], profile: SpeedProfile, routing: str = "replay",
                  overhead_ms: float = 0.0, busy_slowdown: float | Mapping[str, float] = 1.0,
                  behind: bool = True, behind_cost: BehindCost | None = None,
                  fit_reference_ms: float | None = None, service: str = "profile",
                  builder_weight: float | None = None) -> tuple[list[dict], dict]:
    """Rows (one per cell: measured vs predicted P50/P99) and a summary. `service`: "profile"
    prices each request by the fitted profile; "measured" serves it for the engine TTFT the
    sweep measured (no behind work, no scaling, F = 1: those are inside the measured times), so
    what is left of the error is the queueing model and the time outside the engine. `behind`: model the
    work queued behind each answer on the sweep machine's cores (`simulate_engine`'s `cores`)
    where the sweep recorded it, each job priced by `behind_cost` (`fit_behind`) when given.
    `fit_reference_ms`: the fit run's speed reference (`load_fit_extras`); each cell's times
    are scaled by its own reference over it (`speed_scale`). None: unscaled. `builder_weight`:
    a builder's CPU weight against an engine (`slowdown.served_builder_weight` measures it on a
    separate served run); None: CFS's weight of the sweep's `behind_nice`."""
    if service not in ("profile", "measured"):
        raise RcllmError(f"service must be profile or measured, not {service!r}")
    measured = service == "measured"
    if measured:
        behind, fit_reference_ms, busy_slowdown = False, None, 1.0
    recorded = any("behind_tokens" in r for c in sweep["cells"] for r in c["requests"])
    cores = float(sweep.get("cpu_count") or os.cpu_count() or 1) if behind and recorded else None
    # the builder threads' niceness the sweep served with (sweeps before it existed: 0)
    nice = int(sweep.get("behind_nice", 0))
    weight = behind_weight(nice) if builder_weight is None else float(builder_weight)
    k = sweep_instances(sweep)
    replay = _cache_replay(sweep, profile, routing, measured, overhead_ms, behind_cost)
    rows = []
    for c in sweep["cells"]:
        scale = speed_scale(c, fit_reference_ms)
        hits = None
        if replay is not None:
            ttft, svc, hits = replay.cell(c, scale, busy_slowdown, cores, weight)
            own = True
        else:
            ttft, svc, own = simulate_cell(c["arrivals_s"], c["requests"], profile, k,
                                           c["policy"], routing, overhead_ms, busy_slowdown,
                                           cores, behind_cost, scale, measured, weight)
        if len(ttft):
            rows.append(_cell_row(c, ttft, svc, own, sweep.get("capacity_rps"), recorded,
                                  profile, behind_cost, scale, hits))
    summary = {**_errors(rows), "target": 0.15, "profile": profile.name, "routing": routing,
               # --routing caches: the profile its router priced with (file or "fit")
               "router_profile": replay.router_source if replay is not None else None,
               "service": service,
               "relay_prewarms_left_out": _prewarms(sweep),     # not replayed
               "overhead_ms": overhead_ms, "busy_slowdown": busy_slowdown,
               # None: behind work left out (off, or a sweep recorded before behind_tokens)
               "behind_cores": cores, "behind_recorded": recorded,
               # the builders' niceness in the sweep and their CPU weight against an engine's
               "behind_nice": nice, "behind_weight": weight,
               "behind_weight_source": "cfs" if builder_weight is None else "served",
               # [fixed ms, ms per token] fitted on timed builds; None: priced as forward passes
               "behind_cost": list(behind_cost) if behind_cost else None,
               # the fit run's reference pass (ms); None: cells not scaled to the fit's speed
               "fit_reference_ms": fit_reference_ms,
               "predicted": [{"rate_rps": r["rate_rps"], "method": r["method"],
                              "policy": r["policy"], "ttft_p50_ms": r["predicted_p50_ms"],
                              "ttft_p99_ms": r["predicted_p99_ms"]} for r in rows]}
    return rows, summary


def _prewarms(sweep: dict[str, Any]) -> int:
    """The relay's prewarms the sweep sent (`bench serve --sweep --relay-lead-s`), which ran
    on the engines and which the prediction leaves out (module docstring)."""
    return sum(int(c.get("prewarms") or 0) for c in sweep["cells"])


def _cache_replay(sweep, profile, routing, measured, overhead_ms, behind_cost):
    """`--routing caches`' replay of the stores and the router (None for the other routings)."""
    if routing != "caches":
        return None
    if measured:
        raise RcllmError("--service measured replays the sweep's own engine times, which hold "
                         "its hits: it cannot go with --routing caches")
    from .served_cache import CacheReplay

    return CacheReplay(sweep, profile,
                       lambda m, n, ctx: service_ms(profile, m, n, ctx, overhead_ms),
                       lambda n: behind_ms(profile, n, n, behind_cost))


def _cell_row(c: dict[str, Any], ttft: np.ndarray, svc: np.ndarray, own: bool,
              capacity: float | None, recorded: bool, profile: SpeedProfile,
              behind_cost: BehindCost | None, scale: float,
              hits: dict | None = None) -> dict[str, Any]:
    """One cell's measured against predicted P50/P99 (`predict_sweep`'s row); with `hits`
    (`--routing caches`) its predicted hit figures beside the measured ones."""
    ok = [r for r in c["requests"] if r["status"] == 200]
    work = [scale * sum(behind_ms(profile, n, ctx, behind_cost)
                        for n, ctx in r.get("behind_tokens", []))
            for r in ok]
    cpu = [r["thread_cpu_ms"] for r in ok if "thread_cpu_ms" in r]  # sweeps since 2026-12-03
    p50, p99 = float(np.percentile(ttft, 50)), float(np.percentile(ttft, 99))
    below = capacity is None or c["rate_rps"] < capacity
    return {"rate_rps": c["rate_rps"], "series": c["series"], "method": c["method"],
            "policy": c["policy"], "below_capacity": below,
            # which series the cell belongs to (`registry.in_role`), as the sweep recorded it
            **({"roles": c["roles"]} if "roles" in c else {}),
            "routing": "caches" if hits is not None else "simulated" if own else "replayed",
            "measured_p50_ms": c["ttft_p50_ms"], "predicted_p50_ms": p50,
            "p50_rel_err": _rel(p50, c["ttft_p50_ms"]),
            "measured_p99_ms": c["ttft_p99_ms"], "predicted_p99_ms": p99,
            "p99_rel_err": _rel(p99, c["ttft_p99_ms"]),
            "measured_engine_p50_ms": c["engine_ttft_p50_ms"],
            # the CPU the engine thread used: below the engine time = waiting for a core
            "measured_engine_cpu_p50_ms": float(np.median(cpu)) if cpu else None,
            "predicted_service_p50_ms": float(np.percentile(svc, 50)),
            "behind_ms_per_request": float(np.mean(work)) if recorded else None,
            "speed_scale": scale, **_hit_fields(c, hits)}


def _hit_fields(c: dict[str, Any], hits: dict | None) -> dict[str, Any]:
    """Measured and predicted chunk and item-token hit ratios of a cell (none without
    `hits`) and the chunk ratio's error."""
    if hits is None:
        return {}
    from .served_cache import measured_hits

    meas = measured_hits(c)
    pred, got = hits.get("chunk_hit_ratio"), meas.get("chunk_hit_ratio")
    return {"measured_chunk_hit_ratio": got, "predicted_chunk_hit_ratio": pred,
            "chunk_hit_err": None if pred is None or got is None else abs(pred - got),
            "measured_item_token_hit_ratio": meas["item_token_hit_ratio"],
            "predicted_item_token_hit_ratio": hits.get("item_token_hit_ratio"),
            "measured_kv_imported_items": meas["kv_imported_items"],
            "predicted_kv_imported_items": hits.get("kv_imported_items"),
            # the prefix cache's and the user sides' (sim/served_pictures.py)
            **{f"{w}_{k}": src.get(k) for k in ("prefix_hit_ratio", "user_prefix_hit_ratio")
               for w, src in (("measured", meas), ("predicted", hits))}}


def _errors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's error figures over the cells (below capacity: the 15% target's)."""
    below = [r for r in rows if r["below_capacity"]]
    errs = [max(r["p50_rel_err"], r["p99_rel_err"]) for r in below]
    cpu = [r["measured_engine_cpu_p50_ms"] / r["predicted_service_p50_ms"] for r in rows
           if r["measured_engine_cpu_p50_ms"] is not None]
    return {"cells": len(rows), "cells_below_capacity": len(below),
            "within_15pct_below_capacity": sum(e <= 0.15 for e in errs),
            "worst_rel_err_below_capacity": max(errs) if errs else None,
            # --routing caches: cells whose predicted chunk hit ratio is within 0.05
            "hit_within_0.05": sum(r["chunk_hit_err"] <= 0.05 for r in rows
                                   if r.get("chunk_hit_err") is not None),
            "median_p50_rel_err": float(np.median([r["p50_rel_err"] for r in rows]))
            if rows else None,
            "median_p99_rel_err": float(np.median([r["p99_rel_err"] for r in rows]))
            if rows else None,
            # > 1: the served engine ran slower than the fitted profile says, before any
            # queueing (contention for the cores, the builder thread): not a queueing error
            "median_engine_over_predicted_service": float(np.median(
                [r["measured_engine_p50_ms"] / r["predicted_service_p50_ms"] for r in rows]))
            if rows else None,
            "median_engine_cpu_over_predicted_service": float(np.median(cpu)) if cpu else None}
