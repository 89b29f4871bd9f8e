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
- bm25: the text baseline a user tries first. Okapi BM25 (k1 = 1.2, b = 0.75) of each
  candidate's text (title and description) against a query made of the history items' texts,
  with document frequencies over the whole catalog's texts (item texts are not interactions:
  every item's may be read).

Ties are broken by a seeded jitter far below any score difference (and item-kNN by popularity
first): the metrics count ties against the target, which would punish a baseline for
indifference rather than for ranking badly. numpy only (no torch).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable, Mapping, Sequence

import numpy as np

from . import metrics as M
from .protocol import EvalCase
from ..records import Dataset, Item, ItemId, UserId

BASELINES = ("random", "popularity", "item_knn", "bm25")
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


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters and digits) of a text."""
    return re.findall(r"[a-z0-9]+", text.lower())


class Bm25:
    """Okapi BM25 over the catalog's item texts (title and description), one document per item.
    `score(query_terms, item)` sums idf(t) * tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avg|d|))
    over the query's terms, each as often as the query holds it; idf is the non-negative
    ln(1 + (N - df + 0.5) / (df + 0.5))."""

    def __init__(self, items: Mapping[ItemId, Item], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self.tf = {i: Counter(words(f"{it.title} {it.description}")) for i, it in items.items()}
        self.length = {i: sum(tf.values()) for i, tf in self.tf.items()}
        self.avg_length = max(float(np.mean(list(self.length.values()))), 1.0) if items else 1.0
        df = Counter(t for tf in self.tf.values() for t in tf)
        n = len(items)
        self.idf = {t: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}

    def query(self, item_ids: Iterable[ItemId]) -> Counter:
        """The query terms of a history: its items' texts, each term counted as often as it
        occurs there."""
        out: Counter = Counter()
        for i in item_ids:
            out.update(self.tf.get(i, Counter()))
        return out

    def score(self, query: Counter, item: ItemId) -> float:
        tf = self.tf.get(item, Counter())
        norm = self.k1 * (1.0 - self.b + self.b * self.length.get(item, 0) / self.avg_length)
        return sum(q * self.idf[t] * tf[t] * (self.k1 + 1.0) / (tf[t] + norm)
                   for t, q in query.items() if t in tf)


def baseline_scores(name: str, case: EvalCase, co: CoOccurrence, rng: np.random.Generator,
                    text: Bm25 | None = None) -> np.ndarray:
    """Scores of `case.candidates` (higher is better) under baseline `name` (`text`: the
    catalog's BM25 index, which bm25 needs)."""
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
    if name == "bm25":
        if text is None:
            raise ValueError("the bm25 baseline needs the catalog's text index (Bm25)")
        query = text.query(e.item_id for e in case.history)
        return np.array([text.score(query, c) for c in cands]) + jitter
    raise ValueError(f"unknown baseline {name!r}; use one of {', '.join(BASELINES)}")


def baseline_rows(ds: Dataset, cases: Sequence[EvalCase], train_users: Iterable[UserId] = (),
                  names: Sequence[str] = BASELINES, seed: int = 0,
                  ks: Sequence[int] = (1, 5, 10)) -> list[dict]:
    """One `rcllm eval`-shaped row per baseline (ranking metrics and bootstrap CIs only)."""
    co = CoOccurrence(known_interactions(ds, train_users))
    text = Bm25(ds.items) if "bm25" in names else None
    rows = []
    for name in names:
        rng = np.random.default_rng(seed)
        per = [M.ranking_metrics(baseline_scores(name, c, co, rng, text), c.target_index, ks)
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
