"""`rcllm diagnose`: where a tuned ranker's item must meet the user (finetune.diagnose)."""

from __future__ import annotations

import argparse
import json
import os

from ..errors import RcllmError
from ..report import markdown_table
from .common import add_data_options, add_engine_options, load_workload, make_engine

COLUMNS = ("path", "ndcg@10", "ci_low", "ci_high", "delta_vs_full", "delta_ci_low",
           "delta_ci_high", "top1_agreement", "top5_overlap", "user_swap_drop", "drop_ci_low",
           "drop_ci_high", "ndcg@10_same_item", "ndcg@10_same_brand", "ndcg@10_neither")


def register(top, bench) -> None:
    p = top.add_parser(
        "diagnose", formatter_class=argparse.RawTextHelpFormatter,
        help="an adapter's paths on held-out users: full, its fast path, item KV joined with "
             "the user from layer s, item KV built under another user, short items, user "
             "swapped; split by what the target shares with the history")
    add_engine_options(p)
    add_data_options(p, requests=1000)
    p.add_argument("--adapter", metavar="PATH", required=True,
                   help="LoRA adapter from `rcllm finetune` (its prompt, split, fast path)")
    p.add_argument("--users", choices=("heldout", "validation", "test"), default="heldout",
                   help="users of the adapter's split to score (default heldout: validation "
                        "and test pooled, never trained on)")
    p.add_argument("--depths", default="10,20,25,28,30",
                   help="layers s of the late-joint paths: item KV from the chunk store below "
                        "s, every item token computed against the user from s up (0 = full, "
                        "num_layers = naive reuse of the whole chunk); default 10,20,25,28,30")
    p.add_argument("--ratios", default="",
                   help="shares r of the overlap@r paths: rcllm's overlap selection "
                        "(reuse.rcllm_select=overlap, reuse.overlap_fill as configured) "
                        "computing that share of the item tokens; default none")
    p.add_argument("--json", metavar="PATH", help="write the rows and per-request values")
    p.add_argument("--plot", metavar="PNG", help="ΔNDCG@10 vs full against s")
    p.set_defaults(func=run)


def _depths(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise RcllmError(f"--depths must be comma-separated layer numbers, got {text!r}")
    if not out or out[0] < 0:
        raise RcllmError("--depths needs layer numbers >= 0")
    return out


def _ratios(text: str) -> list[float]:
    try:
        out = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise RcllmError(f"--ratios must be comma-separated shares, got {text!r}")
    if out and not (0 < out[0] and out[-1] <= 1):
        raise RcllmError("--ratios needs shares within (0, 1]")
    return out


def run(args) -> int:
    from .eval import _settings
    from ..finetune.diagnose import Diagnoser, diagnose, table

    depths = _depths(args.depths)  # checked before anything loads
    ratios = _ratios(args.ratios)
    if not os.path.isfile(os.path.join(args.adapter, "adapter.json")):
        raise RcllmError(f"no adapter at {args.adapter} (adapter.json missing)")
    args.scorer = None
    cfg, part, adapter = _settings(args)
    if args.scorer != "pointwise":
        raise RcllmError("rcllm diagnose needs an adapter of the pointwise scorer")
    ds, cases = load_workload(args, users=part(args.users))
    engine = make_engine(args, ds, scorer="pointwise", cfg=cfg)
    L = engine.model.arch.num_layers
    if depths[-1] > L:
        raise RcllmError(f"--depths: the model has {L} layers")
    tail = engine.cfg.reuse.item_tail
    print(f"workload: {ds.name}, {len(cases)} requests ({args.users} users); fast path: "
          f"item tail {tail}; late-joint depths {depths} of {L}")
    found = diagnose(Diagnoser(engine.model, engine.pointwise, tail, depths, ratios,
                               engine.cfg.reuse.overlap_fill), cases, ds.items, progress=True)
    rows = table(found)
    print(markdown_table(rows, COLUMNS))
    parts = rows[0]
    print("parts: " + ", ".join(f"{p} {parts['n_' + p]}" for p in
                                ("same_item", "same_brand", "neither")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": adapter, "dataset": ds.name, "users": args.users,
                       "depths": depths, "item_tail": tail, "rows": rows, **found}, f)
        print(f"wrote {args.json}")
    if args.plot:
        _plot(args.plot, rows, depths, L, ds.name)
        print(f"wrote {args.plot}")
    return 0


def _plot(path: str, rows: list[dict], depths: list[int], layers: int, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {r["path"]: r for r in rows}
    ys = [by[f"late@{s}"] for s in depths]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(depths, [r["delta_vs_full"] for r in ys],
                yerr=[[r["delta_vs_full"] - r["delta_ci_low"] for r in ys],
                      [r["delta_ci_high"] - r["delta_vs_full"] for r in ys]],
                marker="o", capsize=3, label="late-joint at s")
    ax.axhline(by["fast"]["delta_vs_full"], color="tab:red", ls="--", label="fast path")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.axhline(-0.02, color="grey", ls=":", lw=0.8, label="−0.02 target")
    ax.set_xlabel(f"s: first layer where item tokens see the user (of {layers})")
    ax.set_ylabel("ΔNDCG@10 vs full (paired 95% CI)")
    ax.set_title(f"{name}: how deep must the item meet the user", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
