"""Training examples from the training users only, drawn deterministically per step.

An example is (user, history, target) from a training user's sequence: with `targets="last"`
the user's last item (the leave-last-out target of the training split, as in
`rcllm.eval.protocol`), with `"all"` every item after the first. Validation and test users are
never read.

Each step's prompt is a pure function of (seed, step): the example comes from a seeded
permutation per epoch, the negatives and the label order from a generator seeded with
(seed, step), the negatives with (seed, example) when they are fixed (`train.negatives=fixed`: an
example's candidates are the same every epoch, in a fresh order). A resumed run therefore sees exactly the prompts an
uninterrupted one would.
Negatives are drawn like the evaluation's (distinct, ∝ popularity, never an item of the user),
with popularity counted over the training users' sequences only, so no evaluated target leaks
in through the counts. The label order is a fresh shuffle every step: the target sits at every
label position equally often, so position bias is unlearnt rather than learnt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import RcllmError
from ..records import Dataset, HistoryEntry, ItemId, UserId


@dataclass(frozen=True)
class Example:
    user_id: UserId
    history: tuple[HistoryEntry, ...]   # oldest first, already cut to the history window
    target: ItemId


@dataclass(frozen=True)
class Draw:
    """One step's prompt contents: candidates in label order and where the target is."""

    example: Example
    candidates: tuple[ItemId, ...]
    target_index: int


def dataset_digest(ds: Dataset) -> str:
    """SHA-256 of the dataset's content (items and histories), independent of file format."""
    h = hashlib.sha256()
    for item_id in sorted(ds.items):
        it = ds.items[item_id]
        h.update(json.dumps([it.item_id, it.title, it.description]).encode())
    for user in sorted(ds.users):
        h.update(json.dumps([user, [[e.item_id, e.rating, e.review, e.timestamp]
                                    for e in ds.users[user]]]).encode())
    return h.hexdigest()


def build_examples(ds: Dataset, users: Sequence[UserId], targets: str, history_window: int
                   ) -> list[Example]:
    out = []
    for user in sorted(users):
        hist = ds.users[user]
        positions = [len(hist) - 1] if targets == "last" else range(1, len(hist))
        for pos in positions:
            if pos < 1:
                continue
            window = tuple(hist[:pos][-history_window:]) if history_window else ()
            out.append(Example(user, window, hist[pos].item_id))
    return out


def cap_examples(examples: Sequence[Example], limit: int) -> list[Example]:
    """At most `limit` examples (0 = all): each user's latest targets first, round-robin over the
    users (every user's last target, then every user's second-to-last, ...; the last round
    taken in user order), returned in their original order. The latest targets are the ones
    nearest the evaluation's (a held-out user's last item)."""
    if not limit or len(examples) <= limit:
        return list(examples)
    rank: dict[int, tuple[int, int]] = {}
    by_user: dict[UserId, list[int]] = {}
    for k, ex in enumerate(examples):
        by_user.setdefault(ex.user_id, []).append(k)
    for u, (_, ks) in enumerate(sorted(by_user.items())):
        for back, k in enumerate(reversed(ks)):
            rank[k] = (back, u)
    keep = sorted(sorted(rank, key=rank.__getitem__)[:limit])
    return [examples[k] for k in keep]


def training_stream(ds: Dataset, users: Sequence[UserId], cfg) -> "ExampleStream":
    """The stream a `FinetuneConfig` trains on (its train and prompt options)."""
    t = cfg.train
    return ExampleStream(ds, users, t.targets, cfg.prompt.history_window, t.candidates, t.seed,
                         t.negatives == "fixed", t.max_examples)


class ExampleStream:
    """`draw(step)` → the step's Draw (see the module docstring)."""

    def __init__(self, ds: Dataset, users: Sequence[UserId], targets: str, history_window: int,
                 candidates: int, seed: int, fixed: bool = False, limit: int = 0):
        self.negatives = candidates - 1
        self.user_items = {u: {e.item_id for e in ds.users[u]} for u in users}
        # users whose items leave too few negatives in the catalogue are skipped (as in eval)
        usable = [ex for ex in build_examples(ds, users, targets, history_window)
                  if len(ds.items) - len(self.user_items[ex.user_id]) >= self.negatives]
        self.available = len(usable)                    # before train.max_examples
        self.examples = cap_examples(usable, limit)
        if not self.examples:
            raise RcllmError("no training example: the training users need >= 2 interactions "
                             f"and {self.negatives} catalogue items they never touched")
        counts: dict[ItemId, int] = dict.fromkeys(sorted(ds.items), 0)
        for user in users:
            for e in ds.users[user]:
                counts[e.item_id] += 1
        self.ids = list(counts)
        # items unseen in training get a tiny weight: drawn only to fill up, as in the evaluation
        self.weights = np.array([counts[i] + 1e-3 for i in self.ids])
        self.index = {item: k for k, item in enumerate(self.ids)}
        self.seed, self.fixed = seed, fixed

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def capped(self) -> int | None:
        """The example count when `limit` cut the usable examples, else None."""
        return len(self) if len(self) < self.available else None

    def draw(self, step: int) -> Draw:
        n = len(self.examples)
        epoch, offset = divmod(step, n)
        perm = np.random.default_rng([self.seed, epoch, 0]).permutation(n)
        which = int(perm[offset])
        ex = self.examples[which]
        rng = np.random.default_rng([self.seed, step, 1])
        # fixed: the example's own negatives, the same every epoch (the order stays fresh)
        pick = np.random.default_rng([self.seed, which, 2]) if self.fixed else rng
        w = self.weights.copy()
        w[[self.index[i] for i in self.user_items[ex.user_id]]] = 0.0
        picks = pick.choice(len(self.ids), size=self.negatives, replace=False, p=w / w.sum())
        cands = [ex.target, *[self.ids[k] for k in picks.tolist()]]
        order = rng.permutation(len(cands)).tolist()
        shuffled = tuple(cands[i] for i in order)
        return Draw(ex, shuffled, order.index(0))
