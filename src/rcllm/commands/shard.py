"""`rcllm shard` (placement of one catalogue over K instances) and `rcllm bench shard`
(METIS vs random vs hash hit rates). Report schemas: docs/sharding.md."""

from __future__ import annotations

import argparse
import logging

from ..errors import RcllmError
from ..report import markdown_table, write_report
from ..sharding.report import SMOLLM2_FP32_BYTES_PER_TOKEN, hit_rates, plot_scaling, shard_rows, sweep
from ..sharding.sharding import METHODS, build_placement
from ..sharding.trace import Trace, build_trace

log = logging.getLogger(__name__)
FIGURE_KS = (1, 2, 3, 5, 7, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("instance counts must be >= 1")
    return values


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="dataset path (file or folder)")
    p.add_argument("--format", default="amazon2018", help="dataset format (load_dataset)")
    p.add_argument("--category", help="category for a dataset folder (amazon2018)")
    p.add_argument("--hot-fraction", type=float, default=0.001,
                   help="fraction of items replicated everywhere (default 0.001, at least 1)")
    p.add_argument("--holdout", type=float, default=0.2, help="held-out user fraction")
    p.add_argument("--bytes-per-token", type=int, default=SMOLLM2_FP32_BYTES_PER_TOKEN,
                   help="KV bytes per token (default: SmolLM2-135M fp32, 46080)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--candidate-source", choices=("popularity", "retrieval"), default="popularity",
                   help="request candidates: popularity-sampled negatives (default) or the "
                        "item-kNN retriever's shortlist (rcllm.eval.protocol)")
    p.add_argument("--json", help="write the report here (reporting contract)")


def _trace(args: argparse.Namespace) -> Trace:
    from ..eval.datasets import load_dataset

    options = {"category": args.category} if args.category else {}
    ds = load_dataset(args.data, args.format, **options)
    if not 0.0 < args.holdout < 1.0:
        raise RcllmError("--holdout must be in (0, 1)")
    trace = build_trace(ds, args.holdout, args.seed, candidate_source=args.candidate_source)
    if not trace.train or not trace.heldout["candidates"]:
        raise RcllmError(f"{args.data}: too few users for a train/held-out split")
    return trace


def _retrieval_summary(trace: Trace) -> dict:
    return {"candidate_source": trace.candidate_source,
            "retrieval_recall": trace.retrieval_recall}


def run_shard(args: argparse.Namespace) -> int:
    trace = _trace(args)
    p = build_placement(trace.train, trace.token_counts, args.instances, args.hot_fraction,
                        args.method, args.seed)
    rows = shard_rows(p, args.bytes_per_token)
    summary = {"items": len(trace.token_counts), "hot_items": len(p.hot),
               "train_requests": len(trace.train),
               "heldout_requests": len(trace.heldout["candidates"]), **hit_rates(p, trace),
               **_retrieval_summary(trace)}
    print(markdown_table(rows, ["instance", "shard_items", "shard_tokens", "items", "tokens",
                                "bytes"]))
    print(markdown_table([summary], list(summary)))
    config = {k: v for k, v in vars(args).items() if k != "func"}
    if args.figure:
        ks = [k for k in FIGURE_KS if k <= args.k_max]
        figure_rows = sweep(trace, ks, args.figure_methods.split(","), args.hot_fraction,
                            args.seed, args.bytes_per_token)
        plot_scaling(figure_rows, args.figure, f"{args.data} ({args.format})")
        summary["figure"] = args.figure
        summary["scaling"] = figure_rows
        print(f"wrote {args.figure}")
    if args.json:
        write_report(args.json, "shard", config, rows, summary)
    return 0


def run_bench(args: argparse.Namespace) -> int:
    trace = _trace(args)
    rows = sweep(trace, args.ks, list(METHODS), args.hot_fraction, args.seed,
                 args.bytes_per_token)
    summary: dict = _retrieval_summary(trace)
    for k in args.ks:
        by = {r["method"]: r for r in rows if r["instances"] == k}
        for view in ("candidates", "history"):
            key = f"hit_rate_{view}_nonhot"
            rand = by["random"][key]
            summary[f"metis_over_random_{view}_nonhot_k{k}"] = (
                by["metis"][key] / rand if rand else float("nan"))
    print(markdown_table(rows, ["instances", "method", "tokens_per_instance_max",
                                "hit_rate_candidates", "hit_rate_candidates_nonhot",
                                "hit_rate_history", "hit_rate_history_nonhot"]))
    print(markdown_table([summary], list(summary)))
    if args.json:
        write_report(args.json, "bench_shard",
                     {k: v for k, v in vars(args).items() if k != "func"}, rows, summary)
    return 0


def register(top, bench) -> None:
    p = top.add_parser("shard", help="place the item catalogue's KV over K instances")
    _data_args(p)
    p.add_argument("--instances", type=int, default=10, help="number of instances K")
    p.add_argument("--method", choices=METHODS, default="metis")
    p.add_argument("--figure", help="write Figure 11 (tokens and hit rate vs K) as a PNG here")
    p.add_argument("--k-max", type=int, default=100, help="largest K in the figure")
    p.add_argument("--figure-methods", default="metis,random", help="methods in the figure")
    p.set_defaults(func=run_shard)
    b = bench.add_parser("shard", help="METIS vs random vs hash sharding hit rates")
    _data_args(b)
    b.add_argument("--ks", type=_int_list, default=[10, 40], help="instance counts (10,40)")
    b.set_defaults(func=run_bench)
