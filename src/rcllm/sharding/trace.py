"""Request traces for sharding, built from a dataset with the evaluation protocol.

Each EvalCase (rcllm.eval.protocol) is one ranking request. Users are split with a seeded
split into a *training* part, whose requests build the co-occurrence graph (history items +
candidates: everything the request touches), and a *held-out* part, whose requests measure the
local hit rate. Two held-out views: "candidates" (the candidate list, what RcLLM's item cache
serves) and "history" (the history window + target: items a user actually chose together).

`candidate_source="retrieval"` gives every request the item-kNN retriever's shortlist
(rcllm.eval.protocol), the retriever built from the training users' past interactions only;
`Trace.retrieval_recall` is then its recall on the held-out requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import Dataset, ItemId
from .tokens import estimate_tokens

TRACE_VIEWS = ("candidates", "history")


@dataclass(frozen=True)
class Trace:
    """Training requests, held-out requests per view, and tokens per catalogue item."""

    train: list[list[ItemId]]
    heldout: dict[str, list[list[ItemId]]]
    token_counts: dict[ItemId, int]
    candidate_source: str = "popularity"
    retrieval_recall: float | None = None   # held-out requests, retrieval candidates only


def item_token_counts(ds: Dataset) -> dict[ItemId, int]:
    """Estimated tokens of each item's prompt text (title + description; see tokens.py)."""
    return {item_id: estimate_tokens(f"{it.title} {it.description}")
            for item_id, it in ds.items.items()}


def build_trace(ds: Dataset, holdout_fraction: float = 0.2, seed: int = 0,
                history_window: int = 10, num_negatives: int = 19,
                candidate_source: str = "popularity") -> Trace:
    """Splits users (seeded) and turns their leave-last-out cases into item lists."""
    from ..eval.protocol import ItemKnnRetriever, build_cases, retrieval_recall, split_users

    train_users, _ = split_users(ds, (1.0 - holdout_fraction, holdout_fraction), seed=seed)
    train_set = set(train_users)
    retriever = (ItemKnnRetriever(ds, train_users) if candidate_source == "retrieval" else None)
    cases = build_cases(ds, history_window=history_window, num_negatives=num_negatives, seed=seed,
                        candidate_source=candidate_source, retriever=retriever)
    train: list[list[ItemId]] = []
    heldout: dict[str, list[list[ItemId]]] = {v: [] for v in TRACE_VIEWS}
    for case in cases:
        history = [h.item_id for h in case.history]
        if case.user_id in train_set:
            train.append(history + list(case.candidates))
        else:
            heldout["candidates"].append(list(case.candidates))
            heldout["history"].append(history + [case.target])
    recall = retrieval_recall([c for c in cases if c.user_id not in train_set])
    return Trace(train, heldout, item_token_counts(ds), candidate_source, recall)
