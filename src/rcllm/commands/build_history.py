"""`rcllm build-history` (the LSH prototype library) and `rcllm bench history` (what it buys)."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import RcllmError
from ..report import markdown_table, write_report
from .common import (Variant, add_data_options, add_engine_options, engine_config, load_data,
                     load_workload, make_engine)

SPLIT = (0.8, 0.1, 0.1)


def register(top, bench) -> None:
    p = top.add_parser("build-history", formatter_class=argparse.RawTextHelpFormatter,
                       help="build the history prototype library (LSH over review tokens)")
    add_engine_options(p)
    add_data_options(p, requests=0)
    p.add_argument("--out", metavar="FILE",
                   help="library file (default: <model cache>/history/<dataset>-<model>.safetensors)")
    p.add_argument("--users", choices=("train", "all"), default="train",
                   help="whose reviews form the corpus: the train part of the 0.8/0.1/0.1 user "
                        "split (seed 0; its test users' reviews stay unseen) or everyone")
    p.add_argument("--max-reviews", type=int, default=2000,
                   help="most corpus reviews, sampled with --seed (default 2000)")
    p.add_argument("--nbits", type=int, default=16, help="LSH code bits (default 16)")
    p.add_argument("--max-prototypes", type=int, default=16384, help="default 16384")
    p.add_argument("--max-bytes", type=int, default=1 << 30,
                   help="byte budget of the prototypes' KV (default 1 GiB)")
    p.add_argument("--position-weight", type=float, default=0.1,
                   help="share of the chunk offset in the token cosine (default 0.1)")
    p.add_argument("--kv-dtype", choices=("float16", "float32"), default="float16",
                   help="storage of the prototype KV (default float16)")
    p.set_defaults(func=run_build)

    b = bench.add_parser("history", formatter_class=argparse.RawTextHelpFormatter,
                         help="prototype match rates, size curve, quality/fidelity and TTFT on "
                              "requests whose reviews are new")
    add_engine_options(b)
    add_data_options(b, requests=12)
    b.add_argument("--library", metavar="FILE", required=True, help="from `rcllm build-history`")
    b.add_argument("--thresholds", default="0.9,0.95,0.99", help="cosines to report match rates at")
    b.add_argument("--sizes", default="1024,2048,4096,8192,16384",
                   help="prototype counts for the size / bytes / match-rate curve")
    b.add_argument("--ratios", default="0.1,0.3,0.5", help="history recompute ratios")
    b.add_argument("--item-ratio", type=float, default=0.3, help="item recompute ratio (default 0.3)")
    b.add_argument("--scorer", choices=("verbalizer", "likelihood"), default="likelihood")
    b.add_argument("--no-eval", action="store_true", help="match statistics only")
    b.add_argument("--json", metavar="PATH", help="write the report here")
    b.set_defaults(func=run_bench)


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RcllmError(f"{what} must be comma-separated numbers, got {text!r}") from None


def _test_users(ds):
    from ..eval.protocol import split_users

    return split_users(ds, SPLIT, seed=0)[2]


def run_build(args) -> int:
    from ..eval.protocol import split_users
    from ..prototypes import BuildOptions, PrototypeLibrary
    from ..model.loading import cache_root

    if args.max_reviews < 1:
        raise RcllmError("--max-reviews must be >= 1")
    cfg = engine_config(args)
    opts = BuildOptions(args.nbits, args.max_prototypes, args.max_bytes, args.position_weight,
                        args.kv_dtype, args.seed)
    opts.validate()
    ds = load_data(args)
    users = split_users(ds, SPLIT, seed=0)[0] if args.users == "train" else sorted(ds.users)
    engine = make_engine(args, ds, cfg=cfg)
    chunks = list(dict.fromkeys(engine.builder.history_chunk(e) for u in users
                                for e in ds.users[u]))
    if len(chunks) > args.max_reviews:
        pick = np.random.default_rng(args.seed).choice(len(chunks), args.max_reviews, replace=False)
        chunks = [chunks[i] for i in sorted(pick)]
    t = time.perf_counter()
    lib = PrototypeLibrary.build(engine.chunks, chunks, opts, progress=True)
    secs = time.perf_counter() - t
    out = Path(args.out) if args.out else (
        cache_root(cfg.model) / "history" / f"{ds.name}-{engine.loaded.fingerprint[:12]}.safetensors")
    lib.save(out)
    d = lib.describe()
    print(f"history library: {d['prototypes']} prototypes ({d['bytes'] / 2**20:.1f} MiB KV) from "
          f"{d['buckets']} LSH buckets over {d['corpus_tokens']} tokens of {d['corpus_reviews']} "
          f"reviews ({args.users} users) in {secs:.0f} s")
    print(f"written to {out}")
    return 0


@dataclass(frozen=True)
class HistoryVariant(Variant):
    """rcllm with or without the prototype library for reviews missing from the exact cache."""

    prototypes: bool = True

    @property
    def label(self) -> str:
        return (f"rcllm {self.item_ratio:g}/{self.history_ratio:g} "
                + ("+prototypes" if self.prototypes else "exact-only"))

    def overrides(self) -> dict:
        return {**super().overrides(), "prototypes": self.prototypes, "cache_misses": False}


class _StatsTap:
    """Passes rank() through to the engine and keeps each run's stats per variant label."""

    def __init__(self, engine, variants):
        self.engine, self.scorer = engine, engine.scorer
        self._labels = {(v.method, v.overrides().get("history_ratio"),
                         v.overrides().get("prototypes")): v.label for v in variants}
        self.stats: dict[str, list[dict]] = defaultdict(list)

    def rank(self, req, method, **kw):
        res = self.engine.rank(req, method, **kw)
        label = self._labels.get((method, kw.get("history_ratio"), kw.get("prototypes")))
        if label is not None:
            self.stats[label].append({**res.stats, "ttft_ms": res.ttft_ms})
        return res


def match_statistics(engine, lib, cases, thresholds, sizes) -> dict:
    """Nearest-prototype cosines of every token of the cases' reviews, by LSH bucket look-up and
    by exact search: match rates per threshold, the share of matches that are the same token
    id, and the rates of the library cut to each size (its most populous prototypes)."""
    import torch

    reviews = list(dict.fromkeys(engine.builder.history_chunk(e) for c in cases for e in c.history))
    embedded = [lib.embed(engine.chunks, ids) for ids in reviews]  # independent of the library's size
    thr = engine.cfg.history.threshold
    out = {"reviews": len(reviews), "threshold": thr, "search": engine.cfg.history.search,
           "tokens": sum(len(ids) for ids in reviews)}
    for search in ("lsh", "exact"):
        cos, same, used = [], [], []
        for ids, emb in zip(reviews, embedded):
            c, idx = lib.search(emb, search)
            cos.append(c)
            used.append(idx[c >= thr])
            same.append((lib.t["token_ids"][idx] == torch.tensor(ids))[c >= thr])
        cos_t = torch.cat(cos)
        out[f"match_rate_{search}"] = {f"{t:g}": float((cos_t >= t).float().mean()) for t in thresholds}
        out[f"same_token_among_matched_{search}"] = float(torch.cat(same).float().mean())
        out[f"distinct_prototypes_used_{search}"] = int(torch.cat(used).unique().numel())
    curve = []
    for size in sorted({min(s, len(lib)) for s in sizes}):
        sub = lib.truncated(int(size))
        row = {"prototypes": len(sub), "bytes": sub.nbytes}
        for search in ("lsh", "exact"):
            c = torch.cat([sub.search(emb, search)[0] for emb in embedded])
            row.update({f"{search} match@{t:g}": float((c >= t).float().mean()) for t in thresholds})
        curve.append(row)
    out["size_curve"] = curve
    return out


def run_bench(args) -> int:
    from ..eval.runner import evaluate

    thresholds = _floats(args.thresholds, "--thresholds")
    sizes = [int(s) for s in _floats(args.sizes, "--sizes")]
    ratios = _floats(args.ratios, "--ratios")
    overrides = list(args.overrides) + [f"history.library={args.library}"]
    cfg = engine_config(argparse.Namespace(config=args.config, overrides=overrides))
    ds, cases = load_workload(args, users=_test_users)
    engine = make_engine(args, ds, scorer=args.scorer, cfg=cfg)
    lib = engine.history_library
    report = {"library": {"path": args.library, **lib.describe()},
              "requests": len(cases), "users": "test part of the 0.8/0.1/0.1 split (seed 0)"}
    print(f"library: {len(lib)} prototypes, {lib.nbytes / 2**20:.1f} MiB")
    stats = match_statistics(engine, lib, cases, thresholds, sizes)
    report["match"] = stats
    for search in ("lsh", "exact"):
        print(f"new review tokens ({stats['tokens']} in {stats['reviews']} reviews) matched by "
              f"{search} at " + ", ".join(f"cos>={t}: {r:.3f}"
                                          for t, r in stats[f"match_rate_{search}"].items()))
    print(markdown_table(stats["size_curve"], list(stats["size_curve"][0])))
    if not args.no_eval:
        engine.build_items(sorted({c for case in cases for c in case.candidates}), progress=True)
        variants = [Variant("full")] + [HistoryVariant("rcllm", args.item_ratio, h, p)
                                        for h in ratios for p in (False, True)]
        tap = _StatsTap(engine, variants)
        rows = evaluate(tap, cases, variants, seed=args.seed, progress=True)
        for row in rows:
            runs = tap.stats.get(row["variant"])
            if not runs:
                continue
            hist_tokens = sum(s["recomputed_by_kind"]["history"] for s in runs)
            total_hist = sum(s["tokens_by_kind"]["history"] for s in runs)
            row["history_recomputed_fraction"] = hist_tokens / max(total_hist, 1)
            row["prototype_tokens_fraction"] = (sum(s["prototype_tokens"] for s in runs)
                                                / max(total_hist, 1))
            # cache lookups + prototype matching + KV gather, on the TTFT path
            row["assemble_p50_ms"] = float(np.median([s["assemble_ms"] for s in runs]))
        report["rows"] = rows
        cols = ["variant", "hr@10", "ndcg@10", "ndcg@10_delta_vs_full", "top1_agreement",
                "kendall_tau", "kl_vs_full", "ttft_p50_ms", "recomputed_fraction",
                "history_recomputed_fraction", "prototype_tokens_fraction", "assemble_p50_ms"]
        print(markdown_table(rows, cols))
    if args.json:
        summary = {k: v for k, v in report.items() if k != "rows"}
        write_report(args.json, "bench_history", cfg, report.get("rows", []), summary)
    return 0
