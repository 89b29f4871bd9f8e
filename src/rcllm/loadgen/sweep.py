"""`rcllm bench serve --sweep`: TTFT under load per method and routing policy, on the served
cluster (issue 30 item 1).

One deployment (K Ray instances, one thread each, a private Redis tier unless `--no-redis`)
serves every cell, so the instances' start-up is paid once. A cell is one (series, rate): a
series is a method with its routing policy (`series.py`) — full routed load-only, prefix as it
is deployed, prefix-aware (to the instance whose prefix cache holds the longest prefix of the
prompt unless its queue is longer: `routing.policies.PrefixAware`), with `prefix@load-only` as
its control, exact-user by its user side (`user-side`), rcllm (and an adapter's own default
method, its fast path) by affinity — or the `--policy-method` (rcllm 0.3/0.3) under each other
policy. With `--relay-lead-s S` a relay runs in front of the series that read the user side
(`series.with_relay`): each ranking's /v1/prewarm leaves S seconds before it (`client`), and the
cells count the prewarms and their engine time (`cells.relay_metrics`). Within
a rate every series runs once, one after the other (so a drift of the shared machine's speed
hits every series alike), the router's policy swapped between cells.

The workload is `loadgen.trace.review_trace`: `--requests` consecutive review events of the
data (`--trace-window`: by default the window with the most distinct users), candidates from
the retrieval stage, arrivals compressed to the cell's rate with the trace's user repeats and
bursts kept. Every cell dates its requests' history a day later than
the cell before (`phases.redated`): each cell's history chunks and user sides are new, so its
hit ratios come from the item shards, the item KV cached so far, and the users who repeat
within the cell — never from an earlier cell's requests. One unmeasured warm-up pass (rcllm,
in waves that are never refused) fills the item caches first, and a wave of each series'
method takes torch's first calls at its shapes off the books; between cells the build-behind
queue is drained, so a cell does not pay for the previous one's misses. With `--cell-reset`
(`--no-redis`) each cell starts from the stores as the warm-up left them (each instance's
memory saved then, put back before the cell: `EngineHost.keep_snapshot`), so a cell's item
hits do not depend on the cells before it; otherwise each inherits what the last one left.

Placement (`--placement metis|random`, `serve.router`): each instance builds its shard and the
hot items at start; the report's `placement` says how many items each was given and kept, and
`catalog_item_kv_bytes` the item KV of the whole catalog (to state `reuse.store_bytes` as a
share of it). Per cell: the numbers of `cells.py` (the prefix cache's hit ratio counted beyond
the instruction's blocks, which every instance inserts at start), with each answered request's `miss_cost_ms`
priced here by the router's cost model (`routing.balance.miss_cost_ms`). Outputs under
`--out`: sweep.json (cells with every request's row; sweep.partial.json holds the cells done
so far while it runs, what a stopped sweep leaves), sweep.md (the table) and two PNGs (TTFT against rate per method and per
policy). Rates: absolute requests/s, or `Nx` = N × capacity, capacity = K × 1000 / the mean
engine time of `prefix` on the trace, measured at start (the simulator's `--load` convention).
"""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np

from ..errors import RcllmError
from ..report import markdown_table
from ..sim.plots import draw_sweep
from .cells import TABLE, cell_metrics
from .client import run_load
from .phases import redated, wait_until_stored
from ..routing.registry import in_role
from .series import (POLICY_METHOD, Series, check_user_sides, parse_method, parse_rates,
                     series_of, with_relay)
from .targets import format_targets, sweep_targets
from .trace import review_trace

# what the sweep keeps of each warm-up request: enough to replay the caches it filled
WARM_FIELDS = ("status", "instance", "method", "user", "items", "history_items", "lookups",
               "hits", "item_tokens", "history_tokens")


def _waves(url: str, bodies: list[dict], size: int, relay: float | None = None) -> dict:
    """`bodies` in waves of `size` sent at once, each wave after the last is answered (the
    warm-up and the capacity probe: as fast as the deployment goes, never refused); `relay`
    (a lead, s): each with its prewarm before it, as the series' cells send them."""
    rows: list[dict] = []
    t0 = time.perf_counter()
    for k in range(0, len(bodies), max(1, size)):
        part = bodies[k:k + max(1, size)]
        rows += run_load(url, part, 0, 600.0, arrivals_s=[0.0] * len(part),
                         keep_rows=True, relay_lead_s=relay)["requests"]
    return {"requests": rows, "sent": len(rows), "ok": sum(r["status"] == 200 for r in rows),
            "wall_s": time.perf_counter() - t0}


def _warm_up(url: str, backend, trace, series, rates, wave: int):
    """The warm-up (every trace body once, then each series' first requests, off the books)
    and, when a rate is relative, the capacity probe: (warm-up summary, capacity rps | None)."""
    warm_fields = parse_method(POLICY_METHOD)[1]     # rcllm: reads (so fills) the item KV
    warm = _waves(url, [{**b, **warm_fields} for b in trace.bodies], wave)
    # each method's first requests (torch's first calls at its shapes) off the books
    first = trace.bodies[:wave]
    for s in series:
        warm["requests"] += _waves(url, [s.body(b) for b in redated(first, -1)],
                                   wave, s.relay_lead_s)["requests"]
    wait_until_stored(backend.store_stats)
    capacity = None
    if any(rel for _v, rel in rates):
        probe = _waves(url, [{**b, "method": "prefix"} for b in trace.bodies], wave)
        warm["requests"] += probe["requests"]
        engine_ms = [r["total_ms"] for r in probe["requests"] if r["status"] == 200]
        if not engine_ms:
            raise RcllmError("the capacity probe got no answer")
        capacity = wave * 1e3 / float(np.mean(engine_ms))
        wait_until_stored(backend.store_stats)
    return warm, capacity


def _cell(url: str, backend, s: Series, args, trace, day: int, at) -> dict:
    """One cell: series `s` at one rate (`at` = value, relative?, rate, arrival times) on the
    trace dated `day` days later (no earlier cell's cache entry matches), then drained."""
    from ..serve.views import UserResidency

    value, rel, rate, arrivals = at
    if getattr(args, "cell_reset", False):
        backend.restore_snapshots()      # the stores as the warm-up left them
    held_at_start = [_digest(i.cached) for i in backend.instances]
    backend.use_policy(s.policy)
    if backend.residency is not None:
        backend.residency = UserResidency(backend.residency.ttl_s,
                                          history_window=backend.residency.history_window)
    bodies = [s.body(b) for b in redated(trace.bodies, day)]
    # the machine's speed now (`model.reference`): the simulator puts the cell and its fit run
    # on one scale with it (the VM's speed drifts within a sweep)
    reference = backend.speed_reference()
    load_before = os.getloadavg()[0]
    res = run_load(url, bodies, rate, args.timeout_s, arrivals_s=arrivals, keep_rows=True,
                   relay_lead_s=s.relay_lead_s)
    drained = wait_until_stored(backend.store_stats)
    price_misses(res["requests"], backend.cost)
    for row, target in zip(res["requests"], trace.targets):   # request order
        row["target"] = target
    cell = {"rate_rps": rate, "rate_label": f"{value:g}x" if rel else f"{value:g}",
            "series": f"{s.name} @ {s.policy}", "method": s.name, "policy": s.policy,
            "roles": list(s.roles), "relay_lead_s": s.relay_lead_s,
            **cell_metrics(res["requests"], res["wall_s"], args.slo_ms,
                           backend.prefix_instruction_tokens, res.get("prewarms")),
            "builds_drained": drained, "arrivals_s": arrivals.tolist(),
            # the items the router counts as held by each instance's own store after the cell
            # (views.LiveInstance), and beside a Redis tier its picture of the tier (tier.py)
            "held_items": [len(i.cached) for i in backend.instances],
            # what each instance held as the cell began (a digest of the item ids):
            # equal in every cell of a `--cell-reset` sweep
            "held_at_start": held_at_start,
            **(backend.tier_stats() or {}),
            "reference_ms": reference,
            # the machine's 1-min load average before and after the cell: a quiet 2-core
            # machine running this sweep stays near 2-3
            "loadavg_1m": [load_before, os.getloadavg()[0]],
            "requests": [dict(r) for r in res["requests"]],
            "prewarm_requests": res.get("prewarms", [])}
    print(f"cell {cell['series']} at {rate:.3f} rps: p50/p99 "
          f"{cell['ttft_p50_ms']:.0f}/{cell['ttft_p99_ms']:.0f} ms, "
          f"{cell['ok']}/{cell['sent']} ok, {cell['rejected_429']} x 429, "
          f"{cell['errors_5xx']} x 5xx, {cell['lost']} lost"
          + (f", served NDCG@10 {cell['served_ndcg10']:.3f}"
             if cell["served_ndcg10"] is not None else "")
          + (f", {cell['prewarms']} prewarms ({cell['prewarm_errors']} failed)"
             if s.relay_lead_s is not None else "") + "; load average "
          f"{load_before:.1f}", flush=True)
    return cell


def _digest(items) -> str:
    """A short digest of a set of item ids (order-free)."""
    import hashlib

    return hashlib.sha1("\n".join(sorted(map(str, items))).encode()).hexdigest()[:12]


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
    from ..kvstore.redis_server import RedisServer
    from ..launch import load_data

    logging.getLogger("httpx").setLevel(logging.WARNING)    # not a line per request
    series = with_relay(series_of(args.methods, args.policies, bool(args.adapter),
                                  args.policy_method),
                        getattr(args, "relay_lead_s", None), getattr(args, "relay_methods", None))
    check_user_sides(series, getattr(args, "scorer", None), bool(args.adapter))
    rates = parse_rates(args.rates)
    profile = _router_profile(args)        # a bad --profile file is refused before anything
    if getattr(args, "cell_reset", False) and not (getattr(args, "no_redis", False)
                                                   and not getattr(args, "kv_dir", None)):
        raise RcllmError("--cell-reset puts each instance's memory back before a cell: it "
                         "needs --no-redis and no --kv-dir (a shared tier is not put back)")
    cap = getattr(args, "redis_max_bytes", None)
    if cap is not None and (getattr(args, "no_redis", False) or cap < 1):
        raise RcllmError("--redis-max-bytes caps the sweep's Redis tier with a positive number "
                         "of bytes: not with --no-redis")
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    trace = review_trace(load_data(args), args.requests, args.candidates, seed=args.seed,
                         window=getattr(args, "trace_window", "users"),
                         session_gap_s=getattr(args, "trace_session_gap_s", 0.0))
    print(f"trace: {json.dumps(trace.summary())}", flush=True)
    redis = None if getattr(args, "no_redis", False) else RedisServer(max_bytes=cap).start()
    try:
        spec = _engine_spec(args, redis)
        run = _serve_cells(spec, args, trace, series, rates, profile)
    finally:
        if redis is not None:
            redis.stop()
    report = {"name": "bench.serve.sweep", "redis_tier": redis is not None,
              "config": {k: v for k, v in vars(args).items() if k != "func"},
              "trace": trace.summary(), "capacity_rps": run["capacity"],
              "start_s": run["start_s"], "cells_arrival_span_s": run["span_s"],
              "slo_ms": args.slo_ms, "instances": args.instances,
              # the instruction's tokens every prefix cache holds from start-up (the cells'
              # prefix hit ratio counts beyond them; `targets.reread` reads it back)
              "prefix_instruction_tokens": run["prefix_instruction_tokens"],
              "router_profile": run["profile"], "cpu_count": os.cpu_count(),
              # the router prices each request at the ratios its payload names (the replay
              # does so only for sweeps that say it; before, every request at 0.3/0.3)
              "router_prices_ratios": True,
              # every cell started from the stores as the warm-up left them (`--cell-reset`)
              "cell_reset": bool(getattr(args, "cell_reset", False)),
              "placement": run["placement"], "affinity_idle_weight": _idle_weight(args),
              "series": [s.__dict__ for s in series],
              # the instances' builder threads' niceness (the simulator weighs them by it)
              "behind_nice": spec.engine_config()[0].reuse.behind_nice,
              "wall_s": time.perf_counter() - t_start, "cells": run["cells"],
              # what the simulator replays the caches from (sim/served_cache.py): each item's
              # chunk tokens and the warm-up's requests in the order they were answered
              "item_tokens": run["item_tokens"], "warm_requests": run["warm_requests"],
              # the instances' memory for review chunks, apart from the item budget
              "history_bytes": spec.history_bytes}
    write_outputs(report, args.out)
    print(f"sweep: {len(run['cells'])} cells in {report['wall_s']:.0f} s; outputs in {args.out}")
    return 0


def _engine_spec(args, redis):
    """The instances' engine, as the arguments describe it, on the private Redis (if any)."""
    from ..serve.spec import EngineSpec

    return EngineSpec(args.config, tuple(args.overrides), args.data, args.format,
                      args.category, args.kv_dir, args.adapter, args.scorer,
                      redis_url=f"redis://127.0.0.1:{redis.port}" if redis else None,
                      kv_encoding=args.kv_encoding)


def _router_profile(args):
    """`--profile`: calibrate (fitted at start on instance 0), builtin, or a profile saved by
    an earlier run (`rcllm serve --save-profile`): the calibration run apart from the sweep."""
    how = getattr(args, "profile", "calibrate")
    if how in ("calibrate", "builtin"):
        return how
    from ..routing.profiles import load_profile

    return load_profile(how)


def _serve_cells(spec, args, trace, series, rates, profile="calibrate") -> dict:
    """Starts the deployment, warms it up and runs every cell on it: {start_s, capacity,
    span_s (the cells' arrivals), cells, profile (the router's)}."""
    from ..serve import lifecycle
    from ..serve.app import create_app
    from ..serve.router import RayBackend
    from ..serve.server import start_in_thread
    from ..serve.settings import ServeSettings

    t0 = time.perf_counter()
    backend = RayBackend(spec, args.instances, args.queue_size, "affinity",
                         placement=getattr(args, "placement", "metis"),
                         placement_seed=getattr(args, "placement_seed", 0),
                         w_idle=_idle_weight(args), profile=profile,
                         fetch_remote=not getattr(args, "no_imports", False))
    lifecycle.install()          # ray.init put its own SIGTERM handler in place
    start_s = time.perf_counter() - t0
    check_user_sides(series, "pointwise" if backend.residency is not None else "listwise",
                     False)
    running = start_in_thread(create_app(backend, ServeSettings(queue_size=args.queue_size)))
    try:
        # one request per instance at a time: never refused, and never queued long
        # enough for the app's 120 s timeout however slow the machine (a wave of a whole
        # queue per instance got 504s on a busy 2-core box)
        print("placement: " + json.dumps({k: v for k, v in backend.placement_info.items()
                                          if k != "placed"}), flush=True)
        warm, capacity = _warm_up(running.url, backend, trace, series, rates, args.instances)
        span_s = sum(len(series) * trace.arrivals_s(v * capacity if rel else v)[-1]
                     for v, rel in rates)
        print(f"start {start_s:.1f} s; warm-up {warm['wall_s']:.1f} s "
              f"({warm['ok']}/{warm['sent']} answered); capacity "
              f"{capacity if capacity is None else round(capacity, 3)} rps; the cells' "
              f"arrivals span {span_s / 60:.1f} min (plus the drain of overloaded cells)",
              flush=True)
        if getattr(args, "cell_reset", False):
            print(f"cell reset: {backend.keep_snapshots()} entries saved after the warm-up",
                  flush=True)
        cells = _cells(running.url, backend, series, rates, capacity, trace, args)
        profile = {"name": backend.profile.name}
    finally:
        running.stop()
    return {"start_s": start_s, "capacity": capacity, "span_s": span_s, "cells": cells,
            "profile": profile, "placement": backend.placement_info,
            "prefix_instruction_tokens": backend.prefix_instruction_tokens,
            "item_tokens": backend.item_tokens, "warm_requests": [
                {k: r.get(k) for k in WARM_FIELDS} for r in warm["requests"]]}


def _idle_weight(args) -> float | None:
    """Affinity's idleness weight the arguments ask for: None = derived from the cost model
    at each decision (`routing.balance`), else the number."""
    value = getattr(args, "affinity_idle_weight", "derived")
    return None if value in (None, "derived") else float(value)


def price_misses(rows: list[dict], cost) -> None:
    """Sets each answered row's `miss_cost_ms`: the TTFT its item tokens computed on the spot
    cost against reusing them, priced by `cost` (None for a method that looks nothing up)."""
    from ..routing.balance import miss_cost_ms

    for r in rows:
        if r.get("status") != 200 or "item_tokens" not in r:
            continue
        r["miss_cost_ms"] = (miss_cost_ms(cost, r.get("context_tokens", 0), r["item_tokens"],
                                          r["item_miss_tokens"]) if r.get("lookups") else None)


def write_outputs(report: dict, out: str) -> None:
    """sweep.json, sweep.md and the two PNGs of a sweep report, with the targets' verdict
    (`targets`) added to the report, written into sweep.md and printed."""
    report["targets"] = sweep_targets(report["cells"], report["slo_ms"])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sweep.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, default=str)
    rows = [{**c, "per_instance": "/".join(str(v) for v in c["per_instance"].values()),
             "held_items": "/".join(str(v) for v in c.get("held_items") or ())}
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
    cells = report["cells"]
    plot_sweep(cells, os.path.join(out, "ttft_vs_rate_methods.png"),
               lambda c: in_role(c, "method"), lambda c: c["method"],
               "TTFT against rate per method (served cluster)")
    named = sorted({c["method"] for c in cells if in_role(c, "policy")})
    plot_sweep(cells, os.path.join(out, "ttft_vs_rate_policies.png"),
               lambda c: in_role(c, "policy"), lambda c: c["policy"],
               f"TTFT against rate per routing policy ({', '.join(named) or 'none'})")


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
