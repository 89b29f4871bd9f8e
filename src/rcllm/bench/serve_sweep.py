"""`rcllm bench serve --sweep`: TTFT under load per method and routing policy, on the served
cluster (issue 30 item 1).

One deployment (K Ray instances, one thread each, a private Redis tier unless `--no-redis`)
serves every cell, so the instances' start-up is paid once. A cell is one (series, rate): a series is a method with
its routing policy — full and prefix routed load-only (their caches do not depend on the
instance), rcllm (and an adapter's own default method, its fast path) by affinity, as in the
simulator — or rcllm 0.3/0.3 under each other policy. Within a rate every series runs once,
one after the other (so a drift of the shared machine's speed hits every series alike), the
router's policy swapped between cells.

The workload is `serve.trace.review_trace`: the last `--requests` review events of the
category, candidates from the retrieval stage, arrivals compressed to the cell's rate with the
trace's user repeats and bursts kept. Every cell dates its requests' history a day later than
the cell before (`phases._redated`): each cell's history chunks and user sides are new, so its
hit ratios come from the item shards, the item KV cached so far, and the users who repeat
within the cell — never from an earlier cell's requests. One unmeasured warm-up pass (rcllm,
in waves that are never refused) fills the item caches first, and a wave of each series'
method takes torch's first calls at its shapes off the books; between cells the build-behind
queue is drained, so a cell does not pay for the previous one's misses.

Per cell: TTFT as the client sees it (arrival to answer: the ranking is the first token; queue
and HTTP included) P50/P90/P99 with a bootstrap 90% interval of P50 and P99, the engine's own
TTFT and the CPU its thread used to reach it (lower: it waited for a core), queue time (client
latency - engine time), goodput (answered within `--slo-ms` per second of the cell's wall time)
and SLO attainment, chunk and user-prefix hit ratios, 429s, 5xx and lost requests (transport
errors or timeouts). Outputs under `--out`: sweep.json (cells with every request's row;
sweep.partial.json holds the cells done so far while it runs, what a stopped sweep leaves),
sweep.md (the table) and two PNGs (TTFT against rate per method and per policy). Rates:
absolute requests/s, or `Nx` = N × capacity, capacity = K × 1000 / the mean engine time of
`prefix` on the trace, measured at start (the simulator's `--load` convention).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import RcllmError
from ..report import markdown_table
from ..sim.plots import draw_sweep, method_cell, policy_cell  # noqa: F401 (shared with sim)

DEFAULT_METHODS = "full,prefix,rcllm:0.3:0.3,rcllm:0.15:0.15"
DEFAULT_POLICIES = "affinity,hit-only,load-only,round-robin"
DEFAULT_RATES = "0.4x,0.7x,1.0x,1.3x,1.6x,2.0x"
POLICY_METHOD = "rcllm:0.3:0.3"     # the method the policy series run
TABLE = ("rate_rps", "series", "method", "policy", "sent", "ok", "rejected_429", "errors_5xx",
         "lost", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "engine_ttft_p50_ms",
         "engine_cpu_p50_ms", "queue_p50_ms", "queue_p99_ms", "goodput_rps", "slo_attainment",
         "chunk_hit_ratio", "user_prefix_hit_ratio", "user_prefix_append_ratio", "per_instance")


@dataclass(frozen=True)
class Series:
    name: str
    policy: str
    fields: dict = field(default_factory=dict)     # added to every body (method, ratios)
    method: str = "default"

    def body(self, body: dict) -> dict:
        return {**body, **self.fields}


def parse_method(spec: str) -> tuple[str, dict]:
    """'full' | 'prefix' | 'rcllm:ITEM:HISTORY' | any engine method | 'adapter' (no method
    field: the served adapter's default, its fast path) → (name, body fields)."""
    parts = spec.split(":")
    if parts[0] == "adapter":
        return "adapter", {}
    if len(parts) == 3:
        try:
            item, hist = float(parts[1]), float(parts[2])
        except ValueError:
            raise RcllmError(f"method {spec!r}: use METHOD:ITEM_RATIO:HISTORY_RATIO") from None
        return (f"{parts[0]}-{item:g}/{hist:g}",
                {"method": parts[0], "item_ratio": item, "history_ratio": hist})
    if len(parts) != 1:
        raise RcllmError(f"method {spec!r}: use METHOD or METHOD:ITEM_RATIO:HISTORY_RATIO")
    return spec, {"method": spec}


def series_of(methods: str, policies: str, adapter: bool) -> list[Series]:
    """The method series (full/prefix load-only, the rest by affinity) and the policy series
    (rcllm 0.3/0.3 under each policy; its affinity cell is the method series' own)."""
    from ..routing import POLICIES

    out: list[Series] = []
    specs = [m for m in methods.split(",") if m]
    if adapter and "adapter" not in specs:
        specs.append("adapter")
    for spec in specs:
        name, fields = parse_method(spec)
        base = fields.get("method", "adapter")
        policy = "load-only" if base in ("full", "prefix") else "affinity"
        out.append(Series(name, policy, fields, base))
    pname, pfields = parse_method(POLICY_METHOD)
    for policy in [p for p in policies.split(",") if p]:
        if policy not in POLICIES:
            raise RcllmError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        if any(s.name == pname and s.policy == policy for s in out):
            continue
        out.append(Series(pname, policy, pfields, "rcllm"))
    if not out:
        raise RcllmError("the sweep needs at least one method or policy")
    return out


def parse_rates(spec: str) -> list[tuple[float, bool]]:
    """'0.5,1,2' (requests/s) or '0.3x,0.6x' (× capacity) → [(value, relative)]."""
    out = []
    for tok in [t for t in spec.split(",") if t]:
        rel = tok.endswith("x")
        try:
            value = float(tok[:-1] if rel else tok)
        except ValueError:
            raise RcllmError(f"--rates {tok!r}: a number, or a number then x") from None
        if value <= 0:
            raise RcllmError(f"--rates {tok!r} must be > 0")
        out.append((value, rel))
    if not out:
        raise RcllmError("--rates is empty")
    return out


def _pct(xs: np.ndarray, q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


def bootstrap_interval(xs: np.ndarray, q: float, level: float = 0.9, draws: int = 1000,
                       seed: int = 0) -> list[float]:
    """Percentile-bootstrap interval of the q-th percentile of `xs`."""
    if len(xs) < 2:
        return [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(xs), size=(draws, len(xs)))
    stats = np.percentile(xs[idx], q, axis=1)
    lo = (1 - level) / 2 * 100
    return [float(np.percentile(stats, lo)), float(np.percentile(stats, 100 - lo))]


def cell_metrics(rows: list[dict], wall_s: float, slo_ms: float) -> dict:
    """The per-cell numbers of one load's per-request rows (module docstring)."""
    ok = [r for r in rows if r["status"] == 200]
    lat = np.array([r["latency_ms"] for r in ok])
    eng = np.array([r["ttft_ms"] for r in ok])
    cpu = np.array([r["thread_cpu_ms"] for r in ok if "thread_cpu_ms" in r])
    split = [(r["ttft_ms"], r["thread_cpu_ms"], r["run_wait_ms"]) for r in ok
             if r.get("run_wait_ms") is not None]
    wall_cpu_wait = np.array(split).sum(axis=0) if split else None
    queue = np.array([max(0.0, r["latency_ms"] - r["total_ms"]) for r in ok])
    within = int((lat <= slo_ms).sum()) if len(lat) else 0
    up = [r["user_prefix"] for r in ok if r.get("user_prefix", "off") != "off"]
    return {"sent": len(rows), "ok": len(ok),
            "rejected_429": sum(r["status"] == 429 for r in rows),
            "errors_5xx": sum(r["status"] >= 500 for r in rows),
            "lost": sum(r["status"] == -1 for r in rows),
            "other_4xx": sum(400 <= r["status"] < 500 and r["status"] != 429 for r in rows),
            "wall_s": wall_s,
            "ttft_p50_ms": _pct(lat, 50), "ttft_p90_ms": _pct(lat, 90),
            "ttft_p99_ms": _pct(lat, 99),
            "ttft_p50_ci90": bootstrap_interval(lat, 50),
            "ttft_p99_ci90": bootstrap_interval(lat, 99),
            "engine_ttft_p50_ms": _pct(eng, 50), "engine_ttft_p99_ms": _pct(eng, 99),
            # CPU its engine thread used to the first token (below the engine TTFT: it waited
            # for a core; the same: it computed the whole time)
            "engine_cpu_p50_ms": _pct(cpu, 50),
            # of the engine threads' time to the first token, the shares spent computing,
            # runnable but waiting for a core, and blocked (I/O, locks); None: not reported
            "engine_time_split": None if wall_cpu_wait is None else {
                "cpu": float(wall_cpu_wait[1] / wall_cpu_wait[0]),
                "run_wait": float(wall_cpu_wait[2] / wall_cpu_wait[0]),
                "blocked": float(1 - (wall_cpu_wait[1] + wall_cpu_wait[2]) / wall_cpu_wait[0])},
            "queue_p50_ms": _pct(queue, 50), "queue_p99_ms": _pct(queue, 99),
            "goodput_rps": within / wall_s if wall_s > 0 else 0.0,
            "slo_attainment": within / max(1, len(rows)),
            "chunk_hit_ratio": sum(r["hits"] for r in ok) / max(1, sum(r["lookups"] for r in ok)),
            "user_prefix_hit_ratio": (sum(u == "hit" for u in up) / len(up)) if up else None,
            # a returning user's history has grown by the last review: at best an append
            "user_prefix_append_ratio": (sum(u == "append" for u in up) / len(up)) if up
            else None,
            "per_instance": {str(k): sum(r["instance"] == k for r in ok)
                             for k in sorted({r["instance"] for r in ok})}}


def _waves(url: str, bodies: list[dict], size: int) -> dict:
    """`bodies` in waves of `size` sent at once, each wave after the last is answered (the
    warm-up and the capacity probe: as fast as the deployment goes, never refused)."""
    from ..serve.loadgen import run_load

    rows: list[dict] = []
    t0 = time.perf_counter()
    for k in range(0, len(bodies), max(1, size)):
        part = bodies[k:k + max(1, size)]
        rows += run_load(url, part, 0, 600.0, arrivals_s=[0.0] * len(part),
                         keep_rows=True)["requests"]
    return {"requests": rows, "sent": len(rows), "ok": sum(r["status"] == 200 for r in rows),
            "wall_s": time.perf_counter() - t0}


def _warm_up(url: str, backend, trace, series, rates, wave: int):
    """The warm-up (every trace body once, then each series' first requests, off the books)
    and, when a rate is relative, the capacity probe: (warm-up summary, capacity rps | None)."""
    from ..serve.phases import _redated, wait_until_stored

    warm_fields = parse_method(POLICY_METHOD)[1]
    warm = _waves(url, [{**b, **warm_fields} for b in trace.bodies], wave)
    # each method's first requests (torch's first calls at its shapes) off the books
    first = trace.bodies[:wave]
    for s in series:
        _waves(url, [s.body(b) for b in _redated(first, -1)], wave)
    wait_until_stored(backend.store_stats)
    capacity = None
    if any(rel for _v, rel in rates):
        probe = _waves(url, [{**b, "method": "prefix"} for b in trace.bodies], wave)
        engine_ms = [r["total_ms"] for r in probe["requests"] if r["status"] == 200]
        if not engine_ms:
            raise RcllmError("the capacity probe got no answer")
        capacity = wave * 1e3 / float(np.mean(engine_ms))
        wait_until_stored(backend.store_stats)
    return warm, capacity


def _cell(url: str, backend, s: Series, args, trace, day: int, at) -> dict:
    """One cell: series `s` at one rate (`at` = value, relative?, rate, arrival times) on the
    trace dated `day` days later (no earlier cell's cache entry matches), then drained."""
    from ..routing import routing_policy
    from ..serve.loadgen import run_load
    from ..serve.phases import _redated, wait_until_stored
    from ..serve.views import UserResidency

    value, rel, rate, arrivals = at
    backend.policy = routing_policy(s.policy, backend.cost)
    if backend.residency is not None:
        backend.residency = UserResidency(backend.residency.ttl_s)
    bodies = [s.body(b) for b in _redated(trace.bodies, day)]
    # the machine's speed now (`model.reference`): the simulator puts the cell and its fit run
    # on one scale with it (the VM's speed drifts within a sweep)
    reference = backend.speed_reference()
    load_before = os.getloadavg()[0]
    res = run_load(url, bodies, rate, args.timeout_s, arrivals_s=arrivals, keep_rows=True)
    drained = wait_until_stored(backend.store_stats)
    cell = {"rate_rps": rate, "rate_label": f"{value:g}x" if rel else f"{value:g}",
            "series": f"{s.name} @ {s.policy}", "method": s.name, "policy": s.policy,
            **cell_metrics(res["requests"], res["wall_s"], args.slo_ms),
            "builds_drained": drained, "arrivals_s": arrivals.tolist(),
            # the items the router counts as held by each instance after the cell (with the
            # Redis tier one shared set; without it what each store kept, views.LiveInstance)
            "held_items": [len(i.cached) for i in backend.instances],
            "reference_ms": reference,
            # the machine's 1-min load average before and after the cell: a quiet 2-core
            # machine running this sweep stays near 2-3
            "loadavg_1m": [load_before, os.getloadavg()[0]],
            "requests": [dict(r) for r in res["requests"]]}
    print(f"cell {cell['series']} at {rate:.3f} rps: p50/p99 "
          f"{cell['ttft_p50_ms']:.0f}/{cell['ttft_p99_ms']:.0f} ms, "
          f"{cell['ok']}/{cell['sent']} ok, {cell['rejected_429']} x 429, "
          f"{cell['errors_5xx']} x 5xx, {cell['lost']} lost; load average "
          f"{load_before:.1f}", flush=True)
    return cell


def _cells(url: str, backend, series, rates, capacity, trace, args) -> list[dict]:
    """Every cell, rate by rate; `sweep.partial.json` rewritten after each (what a stopped
    sweep leaves)."""
    cells: list[dict] = []
    day = 0
    for value, rel in rates:
        rate = value * capacity if rel else value
        arrivals = trace.arrivals_s(rate)
        for s in series:
            day += 1
            cells.append(_cell(url, backend, s, args, trace, day,
                               (value, rel, rate, arrivals)))
            with open(os.path.join(args.out, "sweep.partial.json"), "w",
                      encoding="utf-8") as fh:   # what a stopped sweep leaves
                json.dump({"name": "bench.serve.sweep", "partial": True,
                           "instances": args.instances, "slo_ms": args.slo_ms,
                           "capacity_rps": capacity, "cells": cells}, fh, default=str)
    return cells


def run_sweep(args) -> int:
    """Runs the sweep the arguments describe and writes its outputs (module docstring)."""
    from ..launch import load_data
    from ..kvstore.redis_server import RedisServer
    from ..serve import lifecycle
    from ..serve.app import create_app
    from ..serve.router import RayBackend
    from ..serve.server import start_in_thread
    from ..serve.settings import ServeSettings
    from ..serve.spec import EngineSpec
    from ..serve.trace import review_trace

    logging.getLogger("httpx").setLevel(logging.WARNING)    # not a line per request
    series = series_of(args.methods, args.policies, bool(args.adapter))
    rates = parse_rates(args.rates)
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    trace = review_trace(load_data(args), args.requests, args.candidates, seed=args.seed)
    print(f"trace: {json.dumps(trace.summary())}", flush=True)
    redis = None if getattr(args, "no_redis", False) else RedisServer().start()
    try:
        spec = EngineSpec(args.config, tuple(args.overrides), args.data, args.format,
                          args.category, args.kv_dir, args.adapter, args.scorer,
                          redis_url=f"redis://127.0.0.1:{redis.port}" if redis else None,
                          kv_encoding=args.kv_encoding)
        t0 = time.perf_counter()
        backend = RayBackend(spec, args.instances, args.queue_size, "affinity")
        lifecycle.install()          # ray.init put its own SIGTERM handler in place
        start_s = time.perf_counter() - t0
        running = start_in_thread(create_app(backend, ServeSettings(queue_size=args.queue_size)))
        try:
            # one request per instance at a time: never refused, and never queued long
            # enough for the app's 120 s timeout however slow the machine (a wave of a whole
            # queue per instance got 504s on a busy 2-core box)
            warm, capacity = _warm_up(running.url, backend, trace, series, rates, args.instances)
            span_s = sum(len(series) * trace.arrivals_s(v * capacity if rel else v)[-1]
                         for v, rel in rates)
            print(f"start {start_s:.1f} s; warm-up {warm['wall_s']:.1f} s "
                  f"({warm['ok']}/{warm['sent']} answered); capacity "
                  f"{capacity if capacity is None else round(capacity, 3)} rps; the cells' "
                  f"arrivals span {span_s / 60:.1f} min (plus the drain of overloaded cells)",
                  flush=True)
            cells = _cells(running.url, backend, series, rates, capacity, trace, args)
            profile = {"name": backend.profile.name}
        finally:
            running.stop()
    finally:
        if redis is not None:
            redis.stop()
    report = {"name": "bench.serve.sweep", "redis_tier": redis is not None,
              "config": {k: v for k, v in vars(args).items() if k != "func"},
              "trace": trace.summary(), "capacity_rps": capacity, "start_s": start_s,
              "cells_arrival_span_s": span_s, "slo_ms": args.slo_ms,
              "instances": args.instances, "router_profile": profile,
              "cpu_count": os.cpu_count(), "series": [s.__dict__ for s in series],
              # the instances' builder threads' niceness (the simulator weighs them by it)
              "behind_nice": spec.engine_config()[0].reuse.behind_nice,
              "wall_s": time.perf_counter() - t_start, "cells": cells}
    write_outputs(report, args.out)
    print(f"sweep: {len(cells)} cells in {report['wall_s']:.0f} s; outputs in {args.out}")
    return 0


def write_outputs(report: dict, out: str) -> None:
    """sweep.json, sweep.md and the two PNGs of a sweep report, with the targets' verdict
    (`serve_targets`) added to the report, written into sweep.md and printed."""
    from .serve_targets import format_targets, sweep_targets

    report["targets"] = sweep_targets(report["cells"], report["slo_ms"])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sweep.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, default=str)
    rows = [{**c, "per_instance": "/".join(str(v) for v in c["per_instance"].values())}
            for c in report["cells"]]
    table = markdown_table(rows, TABLE)
    with open(os.path.join(out, "sweep.md"), "w", encoding="utf-8") as fh:
        fh.write(f"# bench serve --sweep: {report['trace']['requests']} requests per cell, "
                 f"{report.get('instances', '?')} instances"
                 f"{', no Redis tier' if report.get('redis_tier') is False else ''}, "
                 f"SLO {report['slo_ms']:g} ms\n\n"
                 f"TTFT = client latency (queue + HTTP + engine); trace {report['trace']}; "
                 f"capacity {report['capacity_rps']} rps; wall {report['wall_s']:.0f} s\n\n")
        fh.write(table + "\n\n```\n" + format_targets(report["targets"]) + "\n```\n")
    print(table)
    print(format_targets(report["targets"]))
    plot_sweep(report["cells"], os.path.join(out, "ttft_vs_rate_methods.png"), method_cell,
               lambda c: c["method"], "TTFT against rate per method (served cluster)")
    plot_sweep(report["cells"], os.path.join(out, "ttft_vs_rate_policies.png"), policy_cell,
               lambda c: c["policy"],
               f"TTFT against rate per routing policy ({parse_method(POLICY_METHOD)[0]})")


def plot_sweep(cells: list[dict], path: str, keep, label, title: str) -> None:
    """One panel of `draw_sweep` written to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    draw_sweep(ax, cells, keep, label, title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
