"""`rcllm bench userprefix` (real model) and `rcllm bench userprefix-relay` (simulation).

Reports follow the reporting contract (`--json PATH`); keys are documented in docs/userprefix.md.
"""

from __future__ import annotations

import argparse


def register(top, bench) -> None:
    from .common import add_engine_options

    p = bench.add_parser("userprefix", help="batched candidates over a cached user prefix vs "
                         "independent forwards", formatter_class=argparse.RawTextHelpFormatter)
    add_engine_options(p)
    p.add_argument("--candidates", default="20,50,100",
                   help="comma-separated C (default 20,50,100)")
    p.add_argument("--prefix-tokens", type=int, default=1500,
                   help="user-side length (default 1500)")
    p.add_argument("--independent", type=int, default=4,
                   help="independent full forwards measured; the C-candidate cost is C × their "
                        "mean (default 4)")
    p.add_argument("--repeats", type=int, default=1, help="timed batched passes per C (median)")
    p.add_argument("--append-entries", type=int, default=3, help="entries appended (drift check)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the report (reporting contract)")
    p.set_defaults(func=run)

    r = bench.add_parser("userprefix-relay", help="simulated SLO throughput and longest user "
                         "sequence with and without pre-inference relay")
    r.add_argument("--instances", type=int, default=4)
    r.add_argument("--requests", type=int, default=4000)
    r.add_argument("--median-tokens", type=int, default=1500, help="median user-side length")
    r.add_argument("--sigma", type=float, default=0.3, help="log-σ of user-side lengths")
    r.add_argument("--slo-ms", type=float, default=100.0, help="P99 latency target")
    r.add_argument("--rate", type=float, default=20.0,
                   help="req/s at which the longest sequence is measured")
    r.add_argument("--per-token-ms", type=float, default=0.02)
    r.add_argument("--per-candidate-ms", type=float, default=0.1)
    r.add_argument("--lead-ms", type=float, default=80.0, help="prewarm ahead of the ranking")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", metavar="PATH", help="write the report (reporting contract)")
    r.set_defaults(func=run_relay)


def run(args) -> int:
    from .common import engine_config
    from ..errors import RcllmError
    from ..model.loading import load_model
    from ..report import write_report
    from ..bench.userprefix import run_bench

    counts = [int(x) for x in args.candidates.split(",") if x.strip()]
    if not counts or min(counts) < 1 or args.independent < 1 or args.append_entries < 1:
        raise RcllmError("--candidates, --independent and --append-entries must be >= 1")
    cfg = engine_config(args)
    loaded = load_model(cfg.model)
    rows, summary = run_bench(loaded, sorted(counts), args.prefix_tokens, args.independent,
                              args.repeats, args.append_entries, args.seed)
    if args.json:
        write_report(args.json, "bench_userprefix",
                     {"engine": cfg, "candidates": sorted(counts),
                      "prefix_tokens": args.prefix_tokens, "independent": args.independent,
                      "repeats": args.repeats, "seed": args.seed}, rows, summary)
    return 0


def run_relay(args) -> int:
    from dataclasses import replace

    from ..report import markdown_table, write_report
    from ..userprefix.relay_sim import SimParams, longest_sequence, max_rate, user_lengths

    p = replace(SimParams(), instances=args.instances, requests=args.requests,
                per_token_ms=args.per_token_ms, per_candidate_ms=args.per_candidate_ms,
                lead_ms=args.lead_ms, seed=args.seed)
    tokens = user_lengths(p, args.median_tokens, args.sigma)
    rows = []
    for relay in (False, True):
        rows.append({"relay": relay,
                     "slo_throughput_per_s": max_rate(p, tokens, relay, args.slo_ms),
                     "longest_tokens": longest_sequence(p, args.rate, relay, args.slo_ms)})
    base, with_relay = rows
    summary = {"throughput_ratio": (with_relay["slo_throughput_per_s"]
                                    / base["slo_throughput_per_s"]
                                    if base["slo_throughput_per_s"] else None),
               "longest_ratio": (with_relay["longest_tokens"] / base["longest_tokens"]
                                 if base["longest_tokens"] else None)}
    print(markdown_table(rows, ("relay", "slo_throughput_per_s", "longest_tokens")))
    print(f"SLO-compliant throughput ×{summary['throughput_ratio'] or 0:.2f}, "
          f"longest sequence ×{summary['longest_ratio'] or 0:.2f}")
    if args.json:
        write_report(args.json, "bench_userprefix_relay",
                     {"params": p, "median_tokens": args.median_tokens, "sigma": args.sigma,
                      "slo_ms": args.slo_ms, "rate_per_s": args.rate}, rows, summary)
    return 0
