"""`rcllm bench serve`: 1 vs K instances and routing policies at one fixed QPS, one run; and,
as options, the deployment's targets in that run: a Redis tier, warm-up over the workload,
then a Redis kill + restart, a soak above capacity with the servers' RSS, an instance kill.

Every configuration serves the same requests (leave-last-out cases of the workload) over
HTTP on loopback through the Ray deployment (K = 1 too, so instance count is the only
difference), and the ratios are against the first configuration. Per configuration the phases
run in this order, each its own row: warm-up (`--warmup N|all` bodies), steady (the workload
at `--qps`: hit ratio after warm-up, HTTP latency over the engine's own TTFT), redis-fault
(`--fault-redis`), soak (`--soak-s S` at `--soak-load` × capacity, capacity = K / the steady
phase's median latency), instance-fault (`--fault-instance`, last: the deployment has K − 1
instances after it).
"""

from __future__ import annotations

import json
import os
import time

from ..errors import RcllmError
from ..report import markdown_table

COLUMNS = ("config", "phase", "sent", "ok", "rejected_429", "failed", "throughput_rps",
           "throughput_vs_first", "latency_p50_ms", "latency_p99_ms", "ttft_p50_ms",
           "ttft_p99_ms", "http_over_engine_ttft_p50", "chunk_hit_ratio", "fetched_items",
           "recomputed_fraction", "per_instance")


def register_bench(bench) -> None:
    from .common import add_candidate_source_option, add_data_options, add_engine_options

    p = bench.add_parser("serve", help="serving throughput / TTFT, 1 vs K instances, policies; "
                                       "faults and a soak as options")
    add_engine_options(p)
    add_data_options(p, requests=40)
    add_candidate_source_option(p)
    p.add_argument("--qps", type=float, default=2.0, help="arrival rate (default 2)")
    p.add_argument("--configs", default="1:affinity,2:affinity,2:round-robin",
                   help="comma list of INSTANCES:POLICY (default 1:affinity,2:affinity,"
                        "2:round-robin)")
    p.add_argument("--queue-size", type=int, default=64, help="admission per instance")
    p.add_argument("--adapter", metavar="PATH", help="serve this tuned ranker (as `serve`)")
    p.add_argument("--scorer", choices=("verbalizer", "likelihood", "pointwise"),
                   help="default: the adapter's, else verbalizer")
    p.add_argument("--redis-local", action="store_true",
                   help="a private redis-server for the run, the Redis tier of every instance")
    p.add_argument("--kv-encoding", choices=("raw", "int8"), default="raw",
                   help="encoding of the disk and Redis tiers")
    p.add_argument("--warmup", default="2", metavar="N|all",
                   help="bodies sent before measuring (all = the whole workload once; "
                        "default 2)")
    p.add_argument("--fault-redis", action="store_true",
                   help="phase: the workload again, Redis killed once 1/3 is answered, "
                        "restarted at 2/3 (needs --redis-local)")
    p.add_argument("--soak-s", type=float, default=0.0, metavar="S",
                   help="phase: S seconds at --soak-load x capacity, RSS of every server "
                        "process sampled (default 0 = off)")
    p.add_argument("--soak-load", type=float, default=2.0, help="soak rate over capacity")
    p.add_argument("--soak-warmup-s", type=float, default=None, metavar="S",
                   help="the soak's own warm-up at its load before RSS is sampled (default a "
                        "fifth of --soak-s, at most 120 s); an instance that affinity kept "
                        "idle fills its bounded caches here")
    p.add_argument("--fault-instance", action="store_true",
                   help="phase (last): the workload again, instance 0 killed once 1/3 is answered")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    _sweep_options(p)
    p.set_defaults(func=run)


def _sweep_options(p) -> None:
    from ..loadgen import series
    from .serve import add_placement_options

    g = p.add_argument_group("rate sweep (--sweep; loadgen/sweep.py)")
    g.add_argument("--sweep", action="store_true",
                   help="TTFT under load per method and routing policy over a rate sweep, on "
                        "--instances Ray instances with a private Redis (unless --no-redis); "
                        "the workload is --requests consecutive review events of the data "
                        "(--trace-window; retrieved candidates, "
                        "arrivals compressed to each rate); --configs and the phases are not "
                        "used")
    _series_options(g)
    g.add_argument("--instances", type=int, default=2, help="Ray instances (default 2)")
    g.add_argument("--trace-window", default="users", metavar="users|tail|at:P",
                   help="which --requests consecutive review events form the trace: users = "
                        "the window with the most distinct users (default), tail = the last "
                        "ones, at:P = the window starting at the P-quantile of the events' "
                        "times (loadgen/trace.py)")
    g.add_argument("--trace-session-gap-s", type=float, default=0.0, metavar="S",
                   help="one request per visit: a user's ratings at most S seconds after "
                        "their previous one belong to the same visit, whose first rating is "
                        "the request (default 0: every rating; MovieLens: 1800)")
    add_placement_options(g)       # --placement(-seed), --affinity-idle-weight, --no-imports
    g.add_argument("--no-redis", action="store_true",
                   help="no Redis tier: each instance's chunk store is its own memory (item KV "
                        "moves between instances through Ray's object store), so with an item "
                        "budget below the catalog's KV (--set reuse.store_bytes=B) the "
                        "instances hold different items")
    g.add_argument("--cell-reset", action="store_true",
                   help="with --no-redis (and no --kv-dir): every cell starts from the item "
                        "and review KV the instances held after the warm-up (each instance's "
                        "memory saved then and put back before each cell), so a cell's hits "
                        "do not depend on the cells before it")
    g.add_argument("--redis-max-bytes", type=int, default=None, metavar="B",
                   help="cap the sweep's private Redis at B bytes (least recently used keys "
                        "evicted past it): a shared tier that holds less than the catalog")
    g.add_argument("--profile", default="calibrate", metavar="calibrate|builtin|PATH",
                   help="the router's speed profile (its cost model: affinity's derived weight, "
                        "the cost policy, the misses' TTFT): calibrate = fitted at start on "
                        "instance 0 (default); PATH = saved by a separate calibration run "
                        "(`rcllm serve --save-profile PATH`)")
    g.add_argument("--slo-ms", type=float, default=5000.0,
                   help="TTFT SLO of the goodput (default 5000 ms)")
    g.add_argument("--timeout-s", type=float, default=300.0,
                   help="client timeout per request; a request over it is counted lost")
    g.add_argument("--report", metavar="SWEEP_JSON",
                   help="run nothing: re-read a finished or stopped sweep (sweep.json or "
                        "sweep.partial.json) at --slo-ms and write its table, PNGs and the "
                        "targets' verdict to --out (loadgen/targets.py)")
    g.add_argument("--out", default="bench-serve-sweep",
                   help="folder of sweep.json, sweep.md and the PNGs (default bench-serve-sweep)")



def _series_options(g) -> None:
    """What the sweep runs: its rates, method series and policy series (loadgen/series.py)."""
    from ..loadgen import series

    g.add_argument("--rates", default=series.DEFAULT_RATES,
                   help="comma list of requests/s, or Nx = N x capacity (K / prefix's mean "
                        f"engine time, measured at start; default {series.DEFAULT_RATES})")
    g.add_argument("--methods", default=series.DEFAULT_METHODS,
                   help="comma list: METHOD or METHOD:ITEM_RATIO:HISTORY_RATIO, each routed by "
                        "its own policy (full load-only, prefix prefix-aware, exact-user "
                        "user-side, the rest affinity) unless @POLICY follows it "
                        "(prefix@load-only: the control); "
                        "with --adapter its default method is added as 'adapter' (default "
                        f"{series.DEFAULT_METHODS})")
    g.add_argument("--policies", default=series.DEFAULT_POLICIES,
                   help="routing policies of the policy series (default "
                        f"{series.DEFAULT_POLICIES})")
    g.add_argument("--policy-method", default=series.POLICY_METHOD,
                   metavar="METHOD[:ITEM_RATIO:HISTORY_RATIO]",
                   help="the method the policy series runs under each of --policies, as in "
                        f"--methods (default {series.POLICY_METHOD}; e.g. rcllm:0.15:0.15 with "
                        "--set reuse.rcllm_select=overlap); checked before any model loads")
    g.add_argument("--relay-lead-s", type=float, default=None, metavar="S",
                   help="a relay in front (needs --scorer pointwise): each ranking's "
                        "/v1/prewarm (its user and history) sent S seconds before it, as a "
                        "relay does at the retrieval stage, for the series whose method reads "
                        "the user side (not full or prefix); cells count the prewarms and "
                        "their engine time (loadgen.md, Relay)")
    g.add_argument("--relay-methods", default=None, metavar="M1,M2",
                   help="with --relay-lead-s: relay only these series' methods (e.g. "
                        "exact-user), each run by a series and reading the user side")


def _bodies(cases) -> list[dict]:
    return [{"user_id": c.user_id, "candidates": list(c.candidates),
             "history": [{"item_id": h.item_id, "rating": h.rating, "review": h.review,
                          "timestamp": h.timestamp} for h in c.history]} for c in cases]


def _warmup_count(arg: str, n: int) -> int:
    if arg == "all":
        return n
    try:
        return max(0, min(n, int(arg)))
    except ValueError:
        raise RcllmError(f"--warmup {arg!r}: give a number or all") from None


def _phases(args, backend, url: str, bodies: list[dict], redis):
    """Yields (phase, summary) for the measured phases of one configuration, in order (module
    docstring), each as soon as it ends."""
    from ..loadgen import phases
    from ..loadgen.client import run_load

    steady = run_load(url, bodies, args.qps)
    yield "steady", steady
    if args.fault_redis:
        yield "redis-fault", phases.redis_fault(url, bodies, args.qps, redis,
                                                backend.store_stats)
    if args.soak_s > 0:
        capacity = len(backend.instances) * 1e3 / max(1.0, steady["latency_p50_ms"])
        pids = {"router+http": os.getpid(),
                **{f"instance{i}": pid for i, pid in enumerate(backend.pids())}}
        res = phases.soak(url, bodies, args.soak_load * capacity, args.soak_s, pids,
                          warm_s=args.soak_warmup_s)
        res["capacity_rps"], res["offered_rps"] = capacity, args.soak_load * capacity
        yield "soak", res
    if args.fault_instance:
        yield "instance-fault", phases.instance_fault(url, bodies, args.qps, backend, 0)


def run(args) -> int:
    from ..serve import lifecycle

    if (getattr(args, "report", None) or getattr(args, "sweep", False)) and args.slo_ms <= 0:
        raise RcllmError("--slo-ms must be > 0")       # before a sweep starts or a file is read
    if getattr(args, "report", None):
        from ..loadgen.sweep import write_outputs
        from ..loadgen.targets import reread

        write_outputs(reread(args.report, args.slo_ms, args.out), args.out)
        print(f"re-read {args.report} at SLO {args.slo_ms:g} ms; outputs in {args.out}")
        return 0
    with lifecycle.stop_signals_exit():   # SIGTERM / SIGHUP: Redis and Ray stopped as on ^C
        if getattr(args, "sweep", False):
            from ..loadgen.sweep import run_sweep

            return run_sweep(args)
        return _run(args)


def _config_rows(args, conf: str, bodies: list[dict], warm: int, redis) -> list[dict]:
    """One INSTANCES:POLICY deployment: its warm-up, then every phase, one row each."""
    from ..loadgen import phases
    from ..loadgen.client import run_load
    from ..serve import lifecycle
    from ..serve.app import create_app
    from ..serve.router import RayBackend
    from ..serve.server import start_in_thread
    from ..serve.settings import ServeSettings
    from ..serve.spec import EngineSpec

    k, policy = conf.split(":")
    rows: list[dict] = []
    spec = EngineSpec(args.config, tuple(args.overrides), args.data, args.format,
                      args.category, args.kv_dir, args.adapter, args.scorer,
                      redis_url=f"redis://127.0.0.1:{redis.port}" if redis else None,
                      kv_encoding=args.kv_encoding)
    t0 = time.perf_counter()
    backend = RayBackend(spec, int(k), args.queue_size, policy)
    lifecycle.install()          # ray.init put its own SIGTERM handler in place
    start_s = time.perf_counter() - t0
    running = start_in_thread(create_app(backend,
                                         ServeSettings(queue_size=args.queue_size)))
    try:
        if warm:
            rows.append({"config": f"{k} x {policy}", "phase": "warm-up",
                         **run_load(running.url, bodies[:warm], args.qps)})
            # steady measures the cache after warm-up: the warm-up's misses are built
            # behind its answers, so wait for them (on a busy machine they were not
            # all built yet when steady began, and it missed)
            phases.wait_until_stored(backend.store_stats)
        for phase, res in _phases(args, backend, running.url, bodies, redis):
            rows.append({"config": f"{k} x {policy}", "phase": phase,
                         "start_s": start_s, **res})
            print(f"{conf} {phase}: {json.dumps(res, default=str)}", flush=True)
        rows[-1]["metrics_tail"] = _metrics(running.url)
    finally:
        running.stop()
    return rows


def _run(args) -> int:
    from ..eval.protocol import retrieval_recall
    from .common import load_workload, print_retrieval_recall

    if args.fault_redis and not args.redis_local:
        raise RcllmError("--fault-redis needs --redis-local (the run must own the server)")
    if args.soak_warmup_s is not None and args.soak_warmup_s < 0:
        raise RcllmError("--soak-warmup-s must be >= 0")
    _ds, cases = load_workload(args)
    recall = retrieval_recall(cases)
    print_retrieval_recall(recall)
    bodies = _bodies(cases)
    warm = _warmup_count(args.warmup, len(bodies))
    redis = None
    if args.redis_local:
        from ..kvstore.redis_server import RedisServer

        redis = RedisServer().start()
    rows = []
    try:
        for conf in args.configs.split(","):
            rows += _config_rows(args, conf, bodies, warm, redis)
    finally:
        if redis is not None:
            redis.stop()
    steady = [r for r in rows if r["phase"] == "steady"]
    for r in rows:
        r["throughput_vs_first"] = r["throughput_rps"] / max(1e-9, steady[0]["throughput_rps"])
    print(markdown_table(rows, COLUMNS))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"config": {k: v for k, v in vars(args).items() if k != "func"},
                       "retrieval_recall": recall, "rows": rows}, fh, indent=1, default=str)
    return 0


def _metrics(url: str) -> str:
    """The deployment's /metrics at the end (chunk-store tiers, latency), for the report."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=60).text
    except httpx.HTTPError as exc:
        return f"unavailable: {exc}"
    keep = ("rcllm_kv_tier_hits", "rcllm_kv_tier_misses", "rcllm_kv_tier_get_seconds_sum",
            "rcllm_kv_tier_get_seconds_count", "rcllm_cache_", "rcllm_kv_build_",
            "rcllm_kv_tier_errors", "rcllm_kv_tier_bytes")
    return "\n".join(line for line in text.splitlines() if line.startswith(keep))
