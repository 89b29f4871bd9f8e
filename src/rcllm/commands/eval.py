"""`rcllm eval`: ranking quality and fidelity against full recompute, with references."""

from __future__ import annotations

import argparse
import os

from ..errors import RcllmError
from ..report import markdown_table, write_report
from .common import (Variant, add_candidate_source_option, add_data_options, add_engine_options,
                     engine_config, load_workload, make_engine, parse_methods)

SPLIT_PARTS = ("train", "validation", "test")
DEFAULT_SPLIT = ((0.8, 0.1, 0.1), 0)
COLUMNS = ("variant", "hr@1", "hr@10", "hr@10_ci_low", "hr@10_ci_high", "ndcg@10",
           "ndcg@10_delta_vs_full", "top1_agreement", "top5_overlap", "kendall_tau", "kl_vs_full", "hidden_cosine_vs_full", "ttft_p50_ms",
           "recomputed_fraction", "user_swap_drop")


def register(top, bench) -> None:
    p = top.add_parser("eval", help="quality and fidelity of each method vs full recompute",
                       formatter_class=argparse.RawTextHelpFormatter)
    add_engine_options(p)
    add_data_options(p, requests=20)
    add_candidate_source_option(p)
    p.add_argument("--methods", default="full,prefix,naive,cacheblend,epic,rcllm",
                   help="comma-separated methods (full is always included)")
    p.add_argument("--item-ratio", type=float,
                   help="item recompute ratio (default: reuse.item_ratio, 0.3, or the one the "
                        "adapter's fast path was validated at)")
    p.add_argument("--history-ratio", type=float,
                   help="history recompute ratio (default: reuse.history_ratio, likewise)")
    p.add_argument("--grid", metavar="R1,R2,..",
                   help="also run rcllm at every (item, history) pair of these ratios and plot a "
                        "budget heat map")
    p.add_argument("--scorer", choices=("verbalizer", "likelihood", "pointwise"),
                   help="verbalizer: label logits at the last position (LlamaRec); likelihood: "
                        "mean log-prob of each candidate's title as the continuation; "
                        "pointwise: yes/no log-odds of each candidate after the user side "
                        "(TALLRec). Default: what the adapter was trained for, else verbalizer")
    p.add_argument("--permutations", type=int, default=1,
                   help="average each item's score over this many label orders (default 1)")
    p.add_argument("--adapter", metavar="PATH",
                   help="LoRA adapter from `rcllm finetune` (sets model.adapter and adopts the "
                        "prompt settings and user split it was trained with)")
    p.add_argument("--users", choices=("all", "heldout") + SPLIT_PARTS, default="all",
                   help="evaluate one part of the user split (the adapter's, else "
                        "0.8,0.1,0.1 with seed 0; `rcllm finetune` trains on `train`); "
                        "heldout = validation and test pooled (never trained on)")
    p.add_argument("--baselines", action="store_true",
                   help="add random, popularity, item-kNN (co-occurrence) and BM25 (the "
                        "candidate's text against the history items' texts) rows")
    p.add_argument("--user-swapped", action="store_true",
                   help="also score every request with another evaluated user's history, on "
                        "full and on every method (rows <method>_user_swapped; user_swap_drop "
                        "= the path's NDCG@10 minus its swapped NDCG@10, paired CI): how much "
                        "each path reads the user. Doubles the evaluation's time")
    p.add_argument("--json", metavar="PATH", help="write the report (reporting contract)")
    p.add_argument("--plots", metavar="DIR", help="write ttft_cdf.png (and heatmap.png) here")
    p.add_argument("--html", metavar="DIR",
                   help="write DIR/report.html: the table, the plots and two example requests "
                        "rendered like the /ui page (implies --plots DIR when --plots is unset)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bench.ttft import prepare_caches
    from ..eval.runner import evaluate

    if args.permutations < 1:  # checked before anything loads
        raise RcllmError("--permutations must be >= 1")
    cfg, part, adapter = _settings(args)
    variants = parse_methods(
        args.methods, cfg.reuse.item_ratio if args.item_ratio is None else args.item_ratio,
        cfg.reuse.history_ratio if args.history_ratio is None else args.history_ratio)
    grid = [float(x) for x in args.grid.split(",")] if args.grid else []
    variants += [Variant("rcllm", i, h) for i in grid for h in grid
                 if Variant("rcllm", i, h) not in variants]
    ds, cases = load_workload(args, users=None if args.users == "all" else part(args.users))
    print(f"workload: {ds.name}, {len(cases)} requests ({args.users} users); scorer {args.scorer}")
    engine = make_engine(args, ds, scorer=args.scorer, cfg=cfg)
    prepare_caches(engine, cases, 0, progress=True)
    rows = evaluate(engine, cases, variants, seed=args.seed, progress=True,
                    permutations=args.permutations, user_swapped=args.user_swapped)
    if args.baselines:
        from ..eval.baselines import baseline_rows

        # baselines may count the training users' whole sequences only when those are not the
        # users evaluated (their last items are then targets)
        known_full = (part("train")(ds) if args.users in ("validation", "test", "heldout")
                      else ())
        rows += baseline_rows(ds, cases, known_full, seed=args.seed)
    print(markdown_table(rows, COLUMNS))
    _outputs(args, cfg, adapter, rows, grid, engine, ds, cases, variants)
    return 0


def _settings(args):
    """The engine config (an adapter's prompt settings when one is given), the user split's
    parts by name, and the adapter. Sets args.scorer (the adapter's, unless given)."""
    from ..eval.protocol import split_users

    cfg = engine_config(args)
    fractions, split_seed = DEFAULT_SPLIT
    adapter = args.adapter or cfg.model.adapter
    scorer = args.scorer or "verbalizer"
    if adapter:
        from ..finetune.adapter import eval_settings, trained_scorer
        from ..launch import chosen_options

        cfg, fractions, split_seed = eval_settings(
            cfg, adapter, chosen_options(args.config, args.overrides))
        scorer = args.scorer or trained_scorer(adapter)
        print(f"adapter {adapter}: prompt settings {cfg.prompt}")
    args.scorer = scorer

    def part(name: str):
        if name == "heldout":
            return lambda d: [u for p in split_users(d, fractions, split_seed)[1:] for u in p]
        return lambda d: split_users(d, fractions, split_seed)[SPLIT_PARTS.index(name)]

    return cfg, part, adapter


def _outputs(args, cfg, adapter, rows, grid, engine, ds, cases, variants) -> None:
    """The plots, the static HTML report and the JSON report, as asked."""
    plots = args.plots or args.html
    if plots:
        _plots(plots, rows, grid)
        print(f"plots in {plots}")
    if args.html:
        from ..eval.html_report import write_html

        path = write_html(args.html, f"rcllm eval — {ds.name}", rows, COLUMNS, engine, cases,
                          variants, plots)
        print(f"wrote {path}")
    if args.json:
        write_report(args.json, "eval", {"engine": cfg, "data": args.data or "synthetic",
                                         "format": args.format, "requests": args.requests,
                                         "scorer": args.scorer, "seed": args.seed,
                                         "permutations": args.permutations,
                                         "users": args.users, "adapter": adapter or None,
                                         "baselines": args.baselines,
                                         "user_swapped": args.user_swapped}, rows,
                     {"requests": len(cases), "dataset": ds.name, "skipped": ds.skipped})
        print(f"wrote {args.json}")


def _plots(folder: str, rows: list[dict], grid: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        if row["variant"] in ("full_reordered", "full_content_swapped") or not row.get(
                "ttft_ms_all"):  # references and baselines have no TTFT of their own
            continue
        t = np.sort(row["ttft_ms_all"])
        ax.step(t, np.arange(1, len(t) + 1) / len(t), where="post", label=row["variant"])
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "ttft_cdf.png"), dpi=120)
    plt.close(fig)
    if not grid:
        return
    cells = {(r["item_ratio"], r["history_ratio"]): r for r in rows if r["method"] == "rcllm"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "ndcg@10_delta_vs_full", "NDCG@10 − full"),
                           (axes[1], "kl_vs_full", "KL(full ‖ rcllm)")):
        mat = np.array([[cells[(i, h)][key] for h in grid] for i in grid])
        im = ax.imshow(mat, origin="lower", cmap="coolwarm")
        ax.set_xticks(range(len(grid)), [f"{g:g}" for g in grid])
        ax.set_yticks(range(len(grid)), [f"{g:g}" for g in grid])
        ax.set_xlabel("history ratio")
        ax.set_ylabel("item ratio")
        ax.set_title(title)
        for (a, b), val in np.ndenumerate(mat):
            ax.text(b, a, f"{val:.3f}", ha="center", va="center", fontsize=7)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "heatmap.png"), dpi=120)
    plt.close(fig)
