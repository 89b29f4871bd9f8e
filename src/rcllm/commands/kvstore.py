"""`rcllm bench kvstore`: tier throughput/latency vs memcpy, fetch vs recompute, INT8 cost.

Recompute time comes from `--recompute-ms-per-token` (measure it with `rcllm bench ttft`, the
engine's benchmark); without it the fetch-vs-recompute columns are null. Redis is benchmarked
on `--redis-port` if given, else on a private redis-server started for the run (skipped with
a note when the binary is absent). Schema: docs/kvstore.md.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..report import markdown_table, write_report


def run_bench(args: argparse.Namespace) -> int:
    from ..bench.kvstore import BenchConfig, run
    from ..kvstore.redis_server import RedisServer, redis_server_path

    cfg = BenchConfig(layers=args.layers, kv_heads=args.kv_heads, head_dim=args.head_dim,
                      tokens=args.tokens, entries=args.entries,
                      recompute_ms_per_token=args.recompute_ms_per_token, seed=args.seed)
    server = None
    port = args.redis_port
    if port is None and not args.no_redis:
        if redis_server_path() is None:
            print("note: redis-server not found; Redis tier skipped")
        else:
            server = RedisServer().start()
            port = server.port
    try:
        rows, summary = run(cfg, redis_port=port)
    finally:
        if server is not None:
            server.stop()
    print(markdown_table(rows, ["tier", "op", "latency_ms_p50", "throughput_gb_s", "vs_memcpy",
                                "stored_bytes", "recompute_over_fetch"]))
    print(markdown_table([summary], [k for k in summary if not k.endswith("_get_ms")]))
    if args.json:
        config = {**dataclasses.asdict(cfg), "redis_port": port}
        write_report(args.json, "bench_kvstore", config, rows, summary)
    return 0


def register(top, bench) -> None:
    b = bench.add_parser("kvstore", help="KV tier throughput/latency vs memcpy and recompute")
    b.add_argument("--layers", type=int, default=30)
    b.add_argument("--kv-heads", type=int, default=3)
    b.add_argument("--head-dim", type=int, default=64)
    b.add_argument("--tokens", type=int, default=128, help="tokens per chunk")
    b.add_argument("--entries", type=int, default=16, help="entries per tier")
    b.add_argument("--recompute-ms-per-token", type=float,
                   help="prefill ms per token of the engine (from `rcllm bench ttft`)")
    b.add_argument("--redis-port", type=int, help="use this 127.0.0.1 Redis instead of a private one")
    b.add_argument("--no-redis", action="store_true", help="skip the Redis tier")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", help="write the report here (reporting contract)")
    b.set_defaults(func=run_bench)
