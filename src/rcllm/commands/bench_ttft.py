"""`rcllm bench ttft` and `rcllm demo`: every method on the same requests, one run."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..report import markdown_table, write_report
from .common import (Variant, add_candidate_source_option, add_data_options, add_engine_options,
                     default_variants, engine_config, load_workload, make_engine, pointwise_variants,
                     print_retrieval_recall)

log = logging.getLogger(__name__)
COLUMNS = ("variant", "ttft_p50_ms", "ttft_p90_ms", "speedup_vs_full", "speedup_vs_prefix",
           "recomputed_fraction", "flop_bound_speedup", "measured_vs_flop_bound",
           "top1_agreement_vs_full", "kl_vs_full")


@dataclass(frozen=True)
class FlatVariant(Variant):
    """rcllm with the same budget in every layer (`reuse.depth_decay` 0, the schedule before
    issue 18): its fidelity and speed beside the depth schedule's, in the same run."""

    @property
    def label(self) -> str:
        return super().label + " flat"

    def overrides(self) -> dict:
        return {**super().overrides(), "depth_decay": 0.0}


def register(top, bench) -> None:
    p = bench.add_parser("ttft", help="TTFT per method on the same requests (ratios vs full)",
                         formatter_class=__import__("argparse").RawTextHelpFormatter)
    add_engine_options(p)
    add_data_options(p, requests=12)
    add_candidate_source_option(p)
    p.add_argument("--new-reviews", type=int, default=0,
                   help="newest reviews per user NOT built ahead (misses computed on the spot)")
    p.add_argument("--compare-flat", action="store_true",
                   help="also run rcllm with the same budget in every layer "
                        "(reuse.depth_decay=0) at each ratio")
    _scorer_options(p, "verbalizer")
    p.add_argument("--json", metavar="PATH", help="write the report (reporting contract)")
    p.set_defaults(func=run)
    d = top.add_parser("demo", help="load the bundled model, build a workload, rank it with "
                                    "each method and print a table",
                       formatter_class=__import__("argparse").RawTextHelpFormatter)
    add_engine_options(d)
    add_data_options(d, requests=6)
    add_candidate_source_option(d)
    d.add_argument("--new-reviews", type=int, default=1,
                   help="newest reviews per user not built ahead (default 1)")
    _scorer_options(d, "pointwise")
    d.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    d.set_defaults(func=run_demo)


def _scorer_options(p, default: str) -> None:
    p.add_argument("--scorer", choices=("verbalizer", "likelihood", "pointwise"),
                   help="verbalizer/likelihood: the listwise prompt; pointwise: the user side "
                        "then one yes/no block per candidate, with rows for a user-prefix hit "
                        f"(default: the adapter's, else {default})")
    p.add_argument("--adapter", metavar="PATH",
                   help="LoRA adapter from `rcllm finetune` (its prompt settings and scorer "
                        "are adopted)")
    p.set_defaults(default_scorer=default)


def _run(args, name: str) -> int:
    from ..bench.ttft import prepare_caches, run_ttft
    from ..model.reference import reference_ms

    t0 = time.perf_counter()
    cfg, scorer = _settings(args)
    ds, cases = load_workload(args)
    print(f"workload: {ds.name}, {len(cases)} requests, {args.candidates} candidates each; "
          f"scorer {scorer}")
    engine = make_engine(args, ds, scorer=scorer, cfg=cfg)
    print(f"model: {engine.loaded.source} ({engine.model.arch.model_type}, "
          f"{engine.model.arch.num_layers} layers, {cfg.model.dtype}, {cfg.model.device})")
    if engine.untuned:
        from ..engine import UNTUNED_NOTE

        print(f"note: {UNTUNED_NOTE}")
    caches = prepare_caches(engine, cases, args.new_reviews, progress=True)
    reference = [reference_ms(engine.model)]     # the machine's speed, before and after
    variants = pointwise_variants() if scorer == "pointwise" else default_variants()
    if getattr(args, "compare_flat", False):
        variants += [FlatVariant("rcllm", v.item_ratio, v.history_ratio) for v in variants
                     if v.method == "rcllm" and not v.user_prefix]
    rows, records = run_ttft(engine, cases, variants, progress=True)
    reference.append(reference_ms(engine.model))
    summary = _summary(args, cases, caches, rows, records, scorer, engine.untuned, reference,
                       time.perf_counter() - t0)
    _print_table(args, rows, caches, summary, engine.untuned)
    if args.json:
        config = {"engine": cfg, "data": args.data or "synthetic", "format": args.format,
                  "requests": args.requests, "candidates": args.candidates, "seed": args.seed,
                  "new_reviews": args.new_reviews, "candidate_source": args.candidate_source}
        write_report(args.json, name, config, rows, {**summary, "requests": records})
        print(f"wrote {args.json}")
    return 0


def _settings(args):
    """(engine config, scorer): the options', with an adapter's settings and scorer adopted."""
    cfg = engine_config(args)
    scorer = args.scorer or args.default_scorer
    if args.adapter:
        from ..finetune.adapter import eval_settings, trained_scorer
        from ..launch import chosen_options

        cfg, _, _ = eval_settings(cfg, args.adapter, chosen_options(args.config, args.overrides))
        scorer = args.scorer or trained_scorer(args.adapter)
    return cfg, scorer


def _summary(args, cases, caches: dict, rows: list[dict], records: list[dict], scorer: str,
             untuned: bool, reference: list[float], wall_s: float) -> dict:
    """The report's summary: the caches built ahead, the workload, the speed reference, and
    each rcllm variant's speedups under its own key."""
    from ..eval.protocol import retrieval_recall

    tokens = [r["context_tokens"] for r in records if r["method"] == "full"]
    summary = {**caches, "request_count": len(cases), "mean_prompt_tokens": sum(tokens) / len(tokens),
               "candidate_source": args.candidate_source, "scorer": scorer,
               "adapter": args.adapter, "untuned": untuned,
               "retrieval_recall": retrieval_recall(cases), "reference_ms": reference,
               "wall_s": wall_s}
    for row in rows:
        if row["method"] == "rcllm":
            tag = f"{row['item_ratio']:g}_{row['history_ratio']:g}"
            tag += "_user_prefix" if row["variant"].endswith("+user prefix") else ""
            tag += "_flat" if row["variant"].endswith(" flat") else ""
            summary[f"rcllm_{tag}_speedup_vs_full"] = row["speedup_vs_full"]
            summary[f"rcllm_{tag}_speedup_vs_prefix"] = row["speedup_vs_prefix"]
    if any(r["speedup_vs_exact_user"] for r in rows):  # every path beside the lossless peer
        summary["speedup_vs_exact_user"] = {r["variant"]: r["speedup_vs_exact_user"]
                                            for r in rows}
    return summary


def _print_table(args, rows: list[dict], caches: dict, summary: dict, untuned: bool) -> None:
    print()
    columns = COLUMNS
    if any(r["speedup_vs_exact_user"] for r in rows):  # the pointwise scorer's lossless peer
        at = COLUMNS.index("speedup_vs_prefix") + 1
        columns = COLUMNS[:at] + ("speedup_vs_exact_user",) + COLUMNS[at:]
    print(markdown_table(rows, columns))
    print(f"\nmean prompt {summary['mean_prompt_tokens']:.0f} tokens; items built ahead "
          f"{caches['items_built_ahead']}, history chunks built ahead "
          f"{caches['history_chunks_built_ahead']}, newest {args.new_reviews} review(s) per user "
          f"computed on the spot; {summary['wall_s']:.0f} s")
    print_retrieval_recall(summary["retrieval_recall"])
    if untuned:  # said again under the table, where the top-1 columns are read
        print("top-1 and KL compare each method with full on the same untuned model: fidelity, "
              "not ranking quality")


def run(args) -> int:
    return _run(args, "bench_ttft")


def run_demo(args) -> int:
    return _run(args, "demo")
