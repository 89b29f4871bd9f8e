"""`rcllm bench serve`: 1 vs K instances and routing policies at one fixed QPS, one run.

Every configuration serves the same requests (leave-last-out cases of the workload) over
HTTP on loopback through the Ray deployment (K = 1 too, so instance count is the only
difference), and the ratios are against the first configuration.
"""

from __future__ import annotations

import time

from ..report import markdown_table

COLUMNS = ("config", "ok", "rejected_429", "failed", "throughput_rps", "throughput_vs_first",
           "latency_p50_ms", "latency_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "chunk_hit_ratio",
           "fetched_items", "recomputed_fraction", "per_instance")


def register_bench(bench) -> None:
    from ..commands.common import add_data_options, add_engine_options

    p = bench.add_parser("serve", help="serving throughput / TTFT, 1 vs K instances, policies")
    add_engine_options(p)
    add_data_options(p, requests=40)
    p.add_argument("--qps", type=float, default=2.0, help="arrival rate (default 2)")
    p.add_argument("--configs", default="1:affinity,2:affinity,2:round-robin",
                   help="comma list of INSTANCES:POLICY (default 1:affinity,2:affinity,"
                        "2:round-robin)")
    p.add_argument("--queue-size", type=int, default=64, help="admission per instance")
    p.set_defaults(func=run)


def _bodies(cases) -> list[dict]:
    return [{"user_id": c.user_id, "candidates": list(c.candidates),
             "history": [{"item_id": h.item_id, "rating": h.rating, "review": h.review,
                          "timestamp": h.timestamp} for h in c.history]} for c in cases]


def run(args) -> int:
    from ..commands.common import load_workload
    from .app import create_app
    from .loadgen import run_load
    from .router import RayBackend
    from .server import start_in_thread
    from .settings import ServeSettings
    from .spec import EngineSpec

    _ds, cases = load_workload(args)
    bodies = _bodies(cases)
    spec = EngineSpec(args.config, tuple(args.overrides), args.data, args.format, args.category)
    rows = []
    for conf in args.configs.split(","):
        k, policy = conf.split(":")
        t0 = time.perf_counter()
        backend = RayBackend(spec, int(k), args.queue_size, policy)
        running = start_in_thread(create_app(backend, ServeSettings(queue_size=args.queue_size)))
        try:
            run_load(running.url, bodies[:2], qps=100.0)          # warm-up (not measured)
            res = run_load(running.url, bodies, args.qps)
        finally:
            running.stop()
        rows.append({"config": f"{k} x {policy}", **res,
                     "start_s": time.perf_counter() - t0 - res["wall_s"]})
        print(f"{conf}: {res}")
    for r in rows:
        r["throughput_vs_first"] = r["throughput_rps"] / rows[0]["throughput_rps"]
    print(markdown_table(rows, COLUMNS))
    return 0
