"""`rcllm bench checkpoints`: sparse prefix checkpoint placement and exact resume."""

from __future__ import annotations

import argparse
import logging

import numpy as np

from ..config import describe, load
from ..report import markdown_table, write_report

log = logging.getLogger(__name__)


def register(top: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    from ..bench.checkpoints import CheckpointBenchConfig

    p = bench.add_parser(
        "checkpoints", help="DP checkpoint placement vs baselines; resume vs full prefill",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="options (--set key=value):\n" + "\n".join(describe(CheckpointBenchConfig)))
    p.add_argument("--config", help="YAML file with options")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an option")
    p.add_argument("--json", metavar="PATH", help="write the report (rcllm.report contract)")
    p.add_argument("--png", metavar="PATH", default="checkpoints_reduction.png",
                   help="reduction-factor plot ('' to skip)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.checkpoints import METHODS, CheckpointBenchConfig, planner_rows, planner_speed, planner_summary, table_rows
    from ..bench.checkpoints_model import model_rows, model_summary

    cfg = load(CheckpointBenchConfig, args.config, args.set)
    rng = np.random.default_rng(cfg.seed)
    rows = planner_rows(cfg, rng)
    budgets = tuple(m for m in (1, 2, 4, 8, 16, 32) if m <= cfg.max_budget)
    columns = ["workload", "M", *METHODS, "dp_vs_best_baseline"]
    print(f"## Recurrent-work reduction E[t] / E[t - l(t)] (N = {cfg.n}; DP planned on "
          f"{cfg.train_requests} past requests, all scored on the true distribution)\n")
    print(markdown_table(table_rows(rows, budgets), columns))
    summary = planner_summary(rows, cfg)
    speed = planner_speed(cfg)
    summary.update(speed)
    print(f"\nplanner: N = {speed['planner_n']}, M = {speed['planner_m']}: "
          f"{speed['planner_s']:.2f} s best of 3, median {speed['planner_s_median']:.2f} s "
          f"(target <= 2 s)")
    mrows = model_rows(cfg, rng)
    if mrows:
        ms = model_summary(mrows)
        summary.update({f"model.{k}": v for k, v in ms.items()})
        print(f"\n## Resume vs full prefill on the recurrent model (prefix {cfg.model_n} tokens, "
              f"M = {cfg.model_budget}, {cfg.model_requests} requests per workload)\n")
        groups = sorted({(r["workload"], r["schedule"]) for r in mrows})
        print(markdown_table([{"workload": w, "schedule": s,
                               "tokens_saved": ms[f"{w}.{s}.tokens_saved_frac"],
                               "time_saved": ms[f"{w}.{s}.time_saved_frac"]} for w, s in groups],
                             ["workload", "schedule", "tokens_saved", "time_saved"]))
        print(f"\nper-request saved tokens vs saved ms: Pearson r = "
              f"{ms['per_request_saved_tokens_vs_ms_pearson']:.3f}; full prefill "
              f"{ms['full_prefill_ms_per_token']:.3f} ms/token; checkpoint load "
              f"{ms['load_ms_mean']:.3f} ms ({ms['state_bytes']} bytes); "
              f"resumed == full prefill bit for bit: {ms['all_exact']}")
    if args.png:
        from ..checkpoints.plot import plot_reduction
        plot_reduction(rows, args.png, METHODS)
        print(f"\nplot: {args.png}")
    if args.json:
        write_report(args.json, "bench.checkpoints", cfg, rows + mrows, summary)
        print(f"report: {args.json}")
    return 0
