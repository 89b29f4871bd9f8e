"""Workloads from real traces: requests built by the evaluation protocol.

`trace_workload(path, fmt)` loads a dataset with `rcllm.eval.datasets.load_dataset`, builds
leave-last-out cases with `rcllm.eval.protocol.build_cases` (history window 10, 1 target + 19
negatives) and turns them into a `Workload`: item tokens from the item text (the catalog's
tokenizer-free estimate, cut at `max_item_tokens`), history tokens from the reviews (cut at
`max_review_tokens`). A trace has far fewer users than a simulation needs requests, so cases are
replayed: request i is a seeded uniform draw among the cases. The placement trace is every
case once (its candidates), what a deployment would partition offline.

`candidate_source="retrieval"`: each case's candidates are the item-kNN retriever's shortlist
(rcllm.eval.protocol; every user's past interactions, no target counted) instead of
popularity-sampled negatives; `Workload.retrieval_recall` is the retriever's recall.
"""

from __future__ import annotations

import numpy as np

from ..errors import RcllmError
from .workload import Workload


def _tokens(text: str, cap: int) -> int:
    from rcllm.sharding.tokens import estimate_tokens
    return min(estimate_tokens(text), cap)


def trace_workload(path: str, fmt: str, num_requests: int = 20_000, seed: int = 0,
                   max_item_tokens: int = 96, max_review_tokens: int = 96,
                   prefix_tokens: int = 200, fresh_tokens: int = 60,
                   candidate_source: str = "popularity", **dataset_options) -> Workload:
    """A replayed trace workload; RcllmError when the eval package or the data is missing."""
    try:
        from rcllm.eval.datasets import load_dataset
        from rcllm.eval.protocol import build_cases, retrieval_recall
    except ModuleNotFoundError as exc:
        raise RcllmError(f"real traces need rcllm.eval ({exc.name} is missing)") from None
    ds = load_dataset(path, fmt, **dataset_options)
    cases = build_cases(ds, history_window=10, num_negatives=19, seed=seed,
                        candidate_source=candidate_source)
    if not cases:
        raise RcllmError(f"{path}: no evaluation cases could be built")
    ids = sorted(ds.items)
    index = {item: i for i, item in enumerate(ids)}
    item_tokens = np.array([_tokens(f"{ds.items[i].title} {ds.items[i].description}",
                                    max_item_tokens) for i in ids], dtype=np.int64)
    width = max(len(c.candidates) for c in cases)
    cands = np.array([[index[x] for x in c.candidates] + [index[c.candidates[0]]]
                      * (width - len(c.candidates)) for c in cases], dtype=np.int64)
    hist_tokens = np.array([sum(_tokens(h.review, max_review_tokens) for h in c.history)
                            for c in cases], dtype=np.int64)
    reviews = np.array([len(c.history) for c in cases], dtype=np.int64)
    pick = np.random.default_rng(seed).integers(0, len(cases), size=num_requests)
    name = f"{fmt}:{ds.name}" + (":retrieval" if candidate_source == "retrieval" else "")
    return Workload(name=name, item_tokens=item_tokens, candidates=cands[pick],
                    history_reviews=reviews[pick], history_tokens=hist_tokens[pick],
                    prefix_tokens=prefix_tokens, fresh_tokens=fresh_tokens,
                    placement_requests=cands, community=None,
                    retrieval_recall=retrieval_recall(cases))


def zipf_alpha(counts: np.ndarray) -> float:
    """The exponent of a Zipf law fitted to item interaction counts: least squares of log
    count on log rank over the items seen at least twice (the singletons' flat tail says
    nothing of the slope). The synthetic catalogue draws item k with weight 1 / k^alpha."""
    c = np.sort(np.asarray(counts, float))[::-1]
    c = c[c >= 2]
    if len(c) < 3:
        raise RcllmError("too few items seen twice to fit a popularity exponent")
    slope = np.polyfit(np.log(np.arange(1, len(c) + 1)), np.log(c), 1)[0]
    return float(max(1e-3, -slope))


def popularity_of(spec: str) -> dict:
    """`PATH:FORMAT[:CATEGORY]` → the dataset's fitted Zipf exponent (`zipf_alpha` over each
    item's interactions in every user's history), its items and interactions."""
    from rcllm.eval.datasets import load_dataset

    path, _, rest = spec.partition(":")
    fmt, _, category = rest.partition(":")
    if not path or not fmt:
        raise RcllmError(f"--zipf-from {spec!r}: use PATH:FORMAT[:CATEGORY]")
    ds = load_dataset(path, fmt, **({"category": category} if category else {}))
    counts: dict = {}
    for hist in ds.users.values():
        for h in hist:
            counts[h.item_id] = counts.get(h.item_id, 0) + 1
    values = np.array(list(counts.values()))
    return {"source": spec, "alpha": zipf_alpha(values), "items": len(values),
            "interactions": int(values.sum())}
