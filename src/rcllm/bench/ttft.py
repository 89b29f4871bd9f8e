"""TTFT of every method on the same requests, measured in one run (`rcllm bench ttft`, demo).

Methods run interleaved per request (full, prefix, naive, ...) so that machine noise hits them
alike; speedups are ratios of medians measured in this run. Item KV is built ahead for every
candidate; history review KV is built ahead for all reviews except each user's newest
`new_reviews` ones, which are misses computed on the spot. Every method of a request sees the
same misses: the methods run with the engine's miss caching off, and the request's misses are
stored (when `reuse.cache_misses` is on) only after all its methods ran. With the pointwise
scorer a variant either builds the user side from reused history chunks (user-prefix miss) or
takes it from the user-prefix cache (`+user prefix`: the user's entry is dropped, then built by
an untimed run of the same method, then the timed run hits it).

Fidelity beside top-1 agreement: the KL divergence of the softmax over the candidates' scores
from full's (`kl_vs_full`), which moves with every score, not only the winner.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import numpy as np
import torch

from ..prompt.builder import RankRequest

ROW_KEYS = ("method", "item_ratio", "history_ratio", "ttft_p50_ms", "ttft_p90_ms",
            "speedup_vs_full", "speedup_vs_prefix", "recomputed_fraction", "flop_bound_speedup",
            "top1_agreement_vs_full", "kl_vs_full")


def prepare_caches(engine, cases, new_reviews: int = 0, progress: bool = False) -> dict:
    items = sorted({c for case in cases for c in case.candidates})
    engine.chunks.timings.clear()
    built_items = engine.build_items(items, progress=progress)
    ahead = [e for case in cases
             for e in (case.history[:-new_reviews] if new_reviews else case.history)]
    built_hist = engine.build_history(ahead, progress=progress)
    # [computed, context, ms] of each chunk built ahead: what a build behind an answer costs
    return {"items_built_ahead": built_items, "history_chunks_built_ahead": built_hist,
            "new_reviews_per_request": new_reviews,
            "chunk_builds": [list(t) for t in engine.chunks.timings]}


def _kl(ref: dict, got: dict) -> float:
    """KL(softmax(ref scores) || softmax(got scores)) over the candidates."""
    keys = list(ref)
    p = torch.log_softmax(torch.tensor([ref[k] for k in keys], dtype=torch.float64), 0)
    q = torch.log_softmax(torch.tensor([got[k] for k in keys], dtype=torch.float64), 0)
    return float((p.exp() * (p - q)).sum())


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def run_ttft(engine, cases, variants, progress: bool = False) -> tuple[list[dict], list[dict]]:
    """Returns (rows, per-request records)."""
    from tqdm import tqdm

    requests = [RankRequest(c.user_id, c.history, c.candidates) for c in cases]
    engine.rank(requests[0], "full", prefix_insert=False)  # warm-up: first-call allocations are not a method's cost
    per: dict[str, list] = {v.label: [] for v in variants}
    records: list[dict] = []
    bar = tqdm(requests, desc="ranking", unit="req", disable=not progress)
    store_misses = engine.cfg.reuse.cache_misses
    for req in bar:
        _rank_variants(engine, req, variants, per, records)
        if store_misses:  # what the engine's cache_misses does after an answer, off the clock
            engine.build_history(req.history)
            engine.build_items(req.candidates)
    return _rows(variants, per), records


def _rank_variants(engine, req: RankRequest, variants, per: dict[str, list],
                   records: list[dict]) -> None:
    """Every variant on `req`, one after the other, each timed: its numbers appended to
    `per[label]` (ttft, recomputed fraction, flops, full flops, top-1 = full's, KL from
    full's) and its record to `records`."""
    top1_full = full_scores = None
    for v in variants:
        # misses are stored after the last method, so that no method hits a chunk an
        # earlier method of the same request computed
        opts = dict(prefix_insert=False, cache_misses=False, **v.overrides())
        if engine.user_prefixes is not None:
            engine.user_prefixes.invalidate_user(req.user_id)
            if v.user_prefix:
                engine.rank(req, v.method, **opts)  # untimed: stores the user side
        r = engine.rank(req, v.method, **opts)
        if v.method == "full":
            top1_full, full_scores = r.ranking[0], r.scores
        s = r.stats
        per[v.label].append((r.ttft_ms, s["recomputed_fraction"], s["flops"], s["full_flops"],
                             r.ranking[0] == top1_full, _kl(full_scores, r.scores)))
        records.append({"method": v.method, "variant": v.label, "user_id": req.user_id,
                        "context_tokens": s["tokens"],
                        "recomputed_tokens": s["recomputed_tokens"],
                        "reused_tokens": sum(s["reused_tokens"].values()) + s["prefix_tokens"],
                        "prefix_tokens": s["prefix_tokens"],
                        "chunk_misses": s["chunk_misses"], "ttft_ms": r.ttft_ms,
                        "build_ms": s["build_ms"], "assemble_ms": s["assemble_ms"],
                        "thread_cpu_ms": s["thread_cpu_ms"],
                        "run_wait_ms": s["run_wait_ms"]})


def _rows(variants, per: dict[str, list]) -> list[dict]:
    """One row per variant: its TTFT percentiles, speedups over full, prefix and exact-user
    (ratios of medians; None where that row is not run), and fidelity against full."""
    p50 = {label: statistics.median(x[0] for x in vals) for label, vals in per.items()}
    full_p50 = p50.get("full")
    prefix_p50 = p50.get("prefix")
    exact_user_p50 = p50.get("exact-user")  # the lossless peer of every cached user side
    rows = []
    for v in variants:
        vals = per[v.label]
        ttft = [x[0] for x in vals]
        rows.append({
            "method": v.method, "variant": v.label,
            "item_ratio": v.item_ratio if v.method in ("rcllm", "cacheblend") else None,
            "history_ratio": v.history_ratio if v.method == "rcllm" else None,
            "ttft_p50_ms": p50[v.label], "ttft_p90_ms": _pct(ttft, 90),
            "speedup_vs_full": full_p50 / p50[v.label] if full_p50 else None,
            "speedup_vs_prefix": prefix_p50 / p50[v.label] if prefix_p50 else None,
            "speedup_vs_exact_user": (exact_user_p50 / p50[v.label] if exact_user_p50
                                      else None),
            "recomputed_fraction": float(np.mean([x[1] for x in vals])),
            "flop_bound_speedup": sum(x[3] for x in vals) / sum(x[2] for x in vals),
            "top1_agreement_vs_full": float(np.mean([x[4] for x in vals])),
            "kl_vs_full": float(np.mean([x[5] for x in vals])),
        })
    for row in rows:
        row["measured_vs_flop_bound"] = (row["speedup_vs_full"] / row["flop_bound_speedup"]
                                         if row["speedup_vs_full"] else None)
    return rows
