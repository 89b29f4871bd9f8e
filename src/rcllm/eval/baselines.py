"""Non-LLM rankers on the same leave-last-out cases: random, popularity, item-kNN.

They answer "what would a user otherwise pick": a tuned LLM ranker is only worth its cost if it
beats them on the same requests.

What they may know (`known_interactions`): every user's history without its last entry, plus
the complete histories of the training users (their last entries are the fine-tuning targets,
so the tuned ranker saw them too). No evaluated target is ever counted.

- random: seeded uniform scores (expected HR@10 = 10 / #candidates).
- popularity: how often the candidate occurs in the known interactions.
- item-kNN: sum over the user's history items h of cosine(h, c) = co(h, c) / sqrt(n_h n_c),
  co(h, c) = number of users who interacted with both (the classic co-occurrence kNN).

Ties are broken by a seeded jitter far below any score difference (and item-kNN by popularity
first): the metrics count ties against the target, which would punish a baseline for
indifference rather than for ranking badly. numpy only (no torch).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from . import metrics as M
from .protocol import EvalCase
from ..records import Dataset, ItemId, UserId

BASELINES = ("random", "popularity", "item_knn")
JITTER = 1e-9


def known_interactions(ds: Dataset, train_users: Iterable[UserId] = ()
                       ) -> dict[UserId, list[ItemId]]:
    """Item sequences a baseline may learn from (see the module docstring)."""
    train = set(train_users)
    return {u: [e.item_id for e in (hist if u in train else hist[:-1])]
            for u, hist in ds.users.items()}


class CoOccurrence:
    """Item counts and pairwise user co-occurrence counts over `known` (one count per user)."""

    def __init__(self, known: dict[UserId, list[ItemId]]):
        self.count: Counter = Counter()
        self.pair: Counter = Counter()
        for items in known.values():
            distinct = sorted(set(items))
            self.count.update(distinct)
            for i, a in enumerate(distinct):
                for b in distinct[i + 1:]:
                    self.pair[(a, b)] += 1

    def cosine(self, a: ItemId, b: ItemId) -> float:
        co = self.pair.get((a, b) if a < b else (b, a), 0)
        return co / np.sqrt(self.count[a] * self.count[b]) if co else 0.0


def baseline_scores(name: str, case: EvalCase, co: CoOccurrence, rng: np.random.Generator
                    ) -> np.ndarray:
    """Scores of `case.candidates` (higher is better) under baseline `name`."""
    cands = case.candidates
    jitter = rng.random(len(cands)) * JITTER
    if name == "random":
        return rng.random(len(cands))
    pop = np.array([float(co.count[c]) for c in cands])
    if name == "popularity":
        return pop + jitter
    if name == "item_knn":
        hist = {e.item_id for e in case.history}
        knn = np.array([sum(co.cosine(h, c) for h in hist) for c in cands])
        # popularity breaks ties among candidates with no co-occurrence at all
        return knn + 1e-6 * np.log1p(pop) / np.log1p(max(pop.max(), 1.0)) + jitter
    raise ValueError(f"unknown baseline {name!r}; use one of {', '.join(BASELINES)}")


def baseline_rows(ds: Dataset, cases: Sequence[EvalCase], train_users: Iterable[UserId] = (),
                  names: Sequence[str] = BASELINES, seed: int = 0,
                  ks: Sequence[int] = (1, 5, 10)) -> list[dict]:
    """One `rcllm eval`-shaped row per baseline (ranking metrics and bootstrap CIs only)."""
    co = CoOccurrence(known_interactions(ds, train_users))
    rows = []
    for name in names:
        rng = np.random.default_rng(seed)
        per = [M.ranking_metrics(baseline_scores(name, c, co, rng), c.target_index, ks)
               for c in cases]
        rows.append({"method": name, "variant": name, "requests": len(cases),
                     "scorer": "baseline", **summarize(per)})
    return rows


def summarize(per: Sequence[dict]) -> dict:
    """Means of per-request ranking metrics plus bootstrap 95% CIs of HR@10 and NDCG@10."""
    out = {key: float(np.mean([r[key] for r in per])) for key in per[0]}
    for key in ("hr@10", "ndcg@10"):
        if key in per[0]:
            ci = M.bootstrap_ci([r[key] for r in per])
            out[f"{key}_ci_low"], out[f"{key}_ci_high"] = ci.low, ci.high
    return out
