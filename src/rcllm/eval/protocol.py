"""The evaluation protocol: leave-last-out requests with popularity-sampled negatives.

For each user with a history h_1..h_n (time order; loaders break timestamp ties by file order,
so "last" is well defined), the **target** is h_n and the **history** shown to the model is the
last `history_window` entries of h_1..h_{n-1}. The **candidates** are the target plus
`num_negatives` distinct items drawn without replacement with probability ∝ their interaction
count in the whole dataset, never an item the user interacted with (anywhere in h_1..h_n);
if too few items with a nonzero count remain, zero-count catalogue items fill up uniformly.
Candidate order is a seeded shuffle.

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


def build_cases(ds: Dataset, history_window: int = 10, num_negatives: int = 19, seed: int = 0,
                max_cases: int | None = None, min_history: int = 1,
                skipped: dict[str, int] | None = None) -> list[EvalCase]:
    """Builds one leave-last-out EvalCase per eligible user (see the module docstring).

    A user is skipped when fewer than `min_history` entries precede the target
    ("short_history") or the catalogue lacks `num_negatives` items outside their history
    ("too_few_negatives"); if `skipped` is given, those counts are added to it.
    Returns at most `max_cases` cases. Raises RcllmError on invalid arguments.
    """
    if history_window < 1 or num_negatives < 0 or min_history < 1:
        raise RcllmError("need history_window >= 1, num_negatives >= 0, min_history >= 1")
    if max_cases is not None and max_cases < 0:
        raise RcllmError("max_cases must be >= 0")
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
        negatives = sampler.sample(rng, num_negatives, {h.item_id for h in hist})
        if negatives is None:
            counts["too_few_negatives"] = counts.get("too_few_negatives", 0) + 1
            continue
        candidates = [target, *negatives]
        shuffled = tuple(candidates[i] for i in rng.permutation(len(candidates)).tolist())
        cases.append(EvalCase(user, tuple(hist[:-1][-history_window:]), shuffled, target))
    return cases


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
