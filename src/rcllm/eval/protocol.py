"""The evaluation protocol: leave-last-out requests with popularity-sampled negatives.

For each user with a history h_1..h_n (time order; loaders break timestamp ties by file order,
so "last" is well defined), the **target** is h_n and the **history** shown to the model is the
last `history_window` entries of h_1..h_{n-1}. The **candidates** are the target plus
`num_negatives` distinct items drawn without replacement with probability ∝ their interaction
count in the whole dataset, never an item the user interacted with (anywhere in h_1..h_n);
if too few items with a nonzero count remain, zero-count catalogue items fill up uniformly.
Candidate order is a seeded shuffle.

**Retrieval candidates** (`candidate_source="retrieval"`): instead of popularity-sampled
negatives, the candidates are what a first-stage retriever shortlists, as in a real two-stage
LLM recommender (LlamaRec; RcLLM's retrieval stage): item-kNN over co-occurrences,
score(c) = Σ over the user's past items h of cos(h, c), cos = co(h, c) / sqrt(n_h n_c), where
co counts the retrieval users who interacted with both (each user's past h_1..h_{n-1}; no
leave-last-out target is ever counted). The shortlist is the top `num_negatives + 1` items
outside the user's own interactions (ties by popularity, then item id); when the target is not
among them (a retriever miss) it replaces the last one, so the ranking metrics stay defined,
and `EvalCase.target_retrieved` records whether the retriever found it: the mean over cases is
the retriever's recall@(num_negatives + 1) (`retrieval_recall`).

Determinism: each user's randomness comes from a generator seeded with (seed, a stable hash
of the user id), so a user's case does not depend on which other users are evaluated or on
`max_cases`. Users are visited in a seeded order so that `max_cases` takes a random subset.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rcllm.errors import RcllmError
from rcllm.records import Dataset, HistoryEntry, ItemId, UserId


@dataclass(frozen=True)
class EvalCase:
    """One ranking request: rank `candidates` for `user_id` given `history`.

    `target` occurs exactly once in `candidates`; `history` is time-ordered (oldest first)
    and holds neither the target nor any negative.
    """

    user_id: UserId
    history: tuple[HistoryEntry, ...]
    candidates: tuple[ItemId, ...]
    target: ItemId
    # retrieval candidates: whether the retriever's shortlist held the target on its own
    # (None for popularity-sampled candidates)
    target_retrieved: bool | None = None

    @property
    def target_index(self) -> int:
        return self.candidates.index(self.target)


def _stable_hash(text: str) -> int:
    """A process-independent 64-bit hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def user_rng(seed: int, user_id: str) -> np.random.Generator:
    """The generator for one user's case: depends only on the seed and the user id."""
    return np.random.default_rng([seed, _stable_hash(user_id)])


class _PopularitySampler:
    """Samples distinct items ∝ popularity, excluding a given set.

    Rejection sampling from the global distribution (a CDF searched with searchsorted) costs
    O(N log I) per request instead of O(I) for renormalising over the whole catalogue; it draws
    the same law as successive sampling without replacement. When rejections pile up (the
    user's items hold most of the mass), it falls back to the exact renormalised draw.
    """

    def __init__(self, ds: Dataset) -> None:
        counts: dict[ItemId, int] = dict.fromkeys(sorted(ds.items), 0)
        for hist in ds.users.values():
            for entry in hist:
                counts[entry.item_id] += 1
        self.ids: list[ItemId] = list(counts)
        self.counts = np.array([counts[i] for i in self.ids], dtype=float)
        self.cdf = np.cumsum(self.counts)
        self.index = {item: k for k, item in enumerate(self.ids)}

    def sample(self, rng: np.random.Generator, n: int, exclude: set[ItemId]) -> list[ItemId] | None:
        """n distinct items not in `exclude`, or None when fewer than n are available."""
        excluded = {self.index[i] for i in exclude if i in self.index}
        if len(self.ids) - len(excluded) < n:
            return None
        chosen: list[int] = []
        seen = set(excluded)
        for _ in range(8):
            draws = np.searchsorted(self.cdf, rng.random(4 * n + 8) * self.cdf[-1], side="right")
            for k in draws.tolist():
                if k not in seen:
                    seen.add(k)
                    chosen.append(k)
                    if len(chosen) == n:
                        return [self.ids[k] for k in chosen]
        return [self.ids[k] for k in chosen + self._exact(rng, n - len(chosen), seen)]

    def _exact(self, rng: np.random.Generator, n: int, seen: set[int]) -> list[int]:
        mask = np.ones(len(self.ids), dtype=bool)
        mask[list(seen)] = False
        pool = np.flatnonzero(mask)
        weights = self.counts[pool]
        nonzero = pool[weights > 0]
        take = min(n, nonzero.size)
        keys = rng.exponential(size=nonzero.size) / self.counts[nonzero]
        picked = nonzero[np.argsort(keys)[:take]].tolist()
        if take < n:  # zero-count items fill up uniformly
            zero = pool[weights == 0]
            picked += rng.choice(zero, size=n - take, replace=False).tolist()
        return picked


class ItemKnnRetriever:
    """First-stage retriever: item-kNN over the co-occurrences of `users`' past interactions.

    `users`: whose interactions build the co-occurrence counts (default every user); only each
    user's h_1..h_{n-1} counts, so no leave-last-out target is ever seen. numpy/scipy only.
    """

    def __init__(self, ds: Dataset, users: Sequence[UserId] | None = None) -> None:
        from scipy import sparse

        self.ids: list[ItemId] = sorted(ds.items)
        self.index = {item: k for k, item in enumerate(self.ids)}
        rows, cols = [], []
        for r, user in enumerate(sorted(ds.users) if users is None else list(users)):
            if user not in ds.users:
                raise RcllmError(f"retrieval user {user!r} is not in the dataset")
            past = {self.index[e.item_id] for e in ds.users[user][:-1] if e.item_id in self.index}
            rows += [r] * len(past)
            cols += sorted(past)
        n = len(self.ids)
        x = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(max(rows, default=-1) + 1, n))
        co = (x.T @ x).tocsr()
        self.popularity = np.asarray(co.diagonal(), dtype=float)
        co.setdiag(0)
        co.eliminate_zeros()
        inv = np.zeros(n)
        inv[self.popularity > 0] = 1.0 / np.sqrt(self.popularity[self.popularity > 0])
        self.similarity = sparse.diags(inv) @ co @ sparse.diags(inv)  # cosine, zero diagonal
        self.similarity = self.similarity.tocsr()

    def scores(self, items: Sequence[ItemId]) -> np.ndarray:
        """Item-kNN score of every catalogue item (index order of `self.ids`) for a history."""
        idx = sorted({self.index[i] for i in items if i in self.index})
        if not idx:
            return np.zeros(len(self.ids))
        return np.asarray(self.similarity[idx].sum(axis=0)).ravel()

    def shortlist(self, history: Sequence[ItemId], n: int, exclude: set[ItemId]) -> list[ItemId]:
        """The top `n` items by score outside `exclude` (ties: popularity, then item id)."""
        score = self.scores(history)
        order = np.lexsort((np.arange(len(self.ids)), -self.popularity, -score))
        banned = {self.index[i] for i in exclude if i in self.index}
        out = []
        for k in order.tolist():
            if k not in banned:
                out.append(self.ids[k])
                if len(out) == n:
                    break
        return out


def retrieval_recall(cases: Sequence[EvalCase]) -> float | None:
    """Share of retrieval cases whose target the retriever shortlisted (None: no such case)."""
    found = [c.target_retrieved for c in cases if c.target_retrieved is not None]
    return float(np.mean(found)) if found else None


CANDIDATE_SOURCES = ("popularity", "retrieval")


def build_cases(ds: Dataset, history_window: int = 10, num_negatives: int = 19, seed: int = 0,
                max_cases: int | None = None, min_history: int = 1,
                skipped: dict[str, int] | None = None, candidate_source: str = "popularity",
                retriever: ItemKnnRetriever | None = None) -> list[EvalCase]:
    """Builds one leave-last-out EvalCase per eligible user (see the module docstring).

    A user is skipped when fewer than `min_history` entries precede the target
    ("short_history") or the catalogue lacks `num_negatives` items outside their history
    ("too_few_negatives"); if `skipped` is given, those counts are added to it.
    `candidate_source`: "popularity" (sampled negatives) or "retrieval" (the shortlist of
    `retriever`, by default an ItemKnnRetriever over every user's past).
    Returns at most `max_cases` cases. Raises RcllmError on invalid arguments.
    """
    if history_window < 1 or num_negatives < 0 or min_history < 1:
        raise RcllmError("need history_window >= 1, num_negatives >= 0, min_history >= 1")
    if max_cases is not None and max_cases < 0:
        raise RcllmError("max_cases must be >= 0")
    if candidate_source not in CANDIDATE_SOURCES:
        raise RcllmError(f"unknown candidate source {candidate_source!r}; use "
                         f"{' or '.join(CANDIDATE_SOURCES)}")
    if candidate_source == "retrieval" and retriever is None:
        retriever = ItemKnnRetriever(ds)
    sampler = _PopularitySampler(ds)
    users = sorted(ds.users)
    order = np.random.default_rng(seed).permutation(len(users))
    counts = skipped if skipped is not None else {}
    cases: list[EvalCase] = []
    for k in order.tolist():
        if max_cases is not None and len(cases) >= max_cases:
            break
        user = users[k]
        hist = ds.users[user]
        if len(hist) - 1 < min_history:
            counts["short_history"] = counts.get("short_history", 0) + 1
            continue
        target = hist[-1].item_id
        rng = user_rng(seed, user)
        seen = {h.item_id for h in hist}
        retrieved = None
        if candidate_source == "retrieval":
            past = {h.item_id for h in hist[:-1]}
            short = retriever.shortlist(sorted(past), num_negatives + 1, past - {target})
            retrieved = target in short
            negatives = [c for c in short if c != target][:num_negatives]
            if len(negatives) < num_negatives:
                negatives = None
        else:
            negatives = sampler.sample(rng, num_negatives, seen)
        if negatives is None:
            counts["too_few_negatives"] = counts.get("too_few_negatives", 0) + 1
            continue
        candidates = [target, *negatives]
        shuffled = tuple(candidates[i] for i in rng.permutation(len(candidates)).tolist())
        cases.append(EvalCase(user, tuple(hist[:-1][-history_window:]), shuffled, target,
                              retrieved))
    return cases


def earlier_cases(ds: Dataset, cases: Sequence[EvalCase], back: int, history_window: int = 10,
                  seed: int = 0) -> list[EvalCase]:
    """Each case's user's `back` earlier targets, after the case itself: the item before the
    user's last (with the `history_window` entries before it), the one before that, ... while at
    least one entry precedes it. Negatives are drawn as `build_cases` draws them (∝ popularity,
    seeded per user and step back), never an item of the user's whole sequence. More requests
    from the same users: a choice made on them resolves smaller differences."""
    if back < 0 or history_window < 1:
        raise RcllmError("need back >= 0 and history_window >= 1")
    sampler = _PopularitySampler(ds)
    out: list[EvalCase] = []
    for case in cases:
        out.append(case)
        hist = ds.users[case.user_id]
        seen = {h.item_id for h in hist}
        for j in range(1, back + 1):
            pos = len(hist) - 1 - j
            if pos < 1:
                break
            rng = np.random.default_rng([seed, _stable_hash(case.user_id), j])
            negatives = sampler.sample(rng, len(case.candidates) - 1, seen)
            if negatives is None:
                break
            target = hist[pos].item_id
            cands = [target, *negatives]
            shuffled = tuple(cands[i] for i in rng.permutation(len(cands)).tolist())
            out.append(EvalCase(case.user_id, tuple(hist[:pos][-history_window:]), shuffled,
                                target))
    return out


def split_users(ds: Dataset, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
                ) -> tuple[list[UserId], ...]:
    """Partitions the users into len(fractions) disjoint lists (e.g. train/validation/test).

    Users are sorted, shuffled with `seed`, and cut at the rounded cumulative fractions, so the
    split is deterministic and every user lands in exactly one part. Fractions must be >= 0 and
    sum to 1.
    """
    f = np.asarray(fractions, dtype=float)
    if f.ndim != 1 or f.size == 0 or (f < 0).any() or abs(f.sum() - 1.0) > 1e-9:
        raise RcllmError(f"fractions must be non-negative and sum to 1, got {list(fractions)}")
    users = sorted(ds.users)
    perm = np.random.default_rng(seed).permutation(len(users))
    cuts = np.rint(np.cumsum(f) * len(users)).astype(int)
    cuts[-1] = len(users)
    starts = np.concatenate([[0], cuts[:-1]])
    return tuple([users[i] for i in perm[s:e].tolist()] for s, e in zip(starts, cuts))
