"""A deterministic synthetic review dataset for the demo and the default tests.

Shape, chosen to exercise what RcLLM's caches exploit:
- long-tail popularity: item weights follow a Zipf law over a seeded random ranking, so a few
  items appear in many users' histories and candidate lists;
- co-occurring communities: each item belongs to one topic; each user prefers one topic (and
  sometimes a second) and draws most of their items from it, so items of a topic co-occur;
- templated text from small phrase banks, so review phrases recur across users: item
  descriptions are 40-90 tokens, reviews 20-80 tokens (tokens as counted by `approx_tokens`).
Timestamps are day-granular with occasional same-day ties, like the Amazon 2018 files.

Same arguments → identical `Dataset`. 200 users × 300 items generate in a few milliseconds.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Iterable, Sequence

import numpy as np

from rcllm.errors import RcllmError
from rcllm.records import Dataset, HistoryEntry, Item, ItemId, UserId

from ._common import approx_tokens
from ._synthetic_text import (BRANDS, DESCRIPTION_TEMPLATES, REVIEW_BODY, REVIEW_CLOSERS,
                              REVIEW_OPENERS, TOPICS, Topic)

_DAY_S = 86_400
_START_S = 1_420_070_400  # 2015-01-01
_RATINGS = np.array([1, 2, 3, 4, 5])
_RATING_P = np.array([0.04, 0.05, 0.11, 0.25, 0.55])  # Amazon-like skew towards 5 stars


class _Draw:
    """Cheap picks from a seeded Generator (uniforms drawn in blocks) and memoised token counts.

    Per-call numpy overhead dominated generation time; a block of 4,096 uniforms keeps the
    generator seeded and deterministic while text assembly stays in plain Python.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._block: list[float] = []
        self._next = 0
        self._tokens: dict[str, int] = {}  # sentences recur a lot: count each once

    def tokens(self, text: str) -> int:
        n = self._tokens.get(text)
        if n is None:
            n = self._tokens[text] = approx_tokens(text)
        return n

    def uniform(self) -> float:
        if self._next == len(self._block):
            self._block, self._next = self._rng.random(4096).tolist(), 0
        self._next += 1
        return self._block[self._next - 1]

    def index(self, n: int) -> int:
        return int(self.uniform() * n)  # uniform() < 1, so the index is < n

    def pick(self, seq: Sequence[str]) -> str:
        return seq[int(self.uniform() * len(seq))]

    def order(self, n: int) -> list[int]:
        return sorted(range(n), key=lambda _: self.uniform())


def _fill(draw: _Draw, template: str, topic: Topic, **fixed: str) -> str:
    """Fills a template's slots with phrases of `topic` (or the `fixed` values).

    Only the slots the template names are drawn: text assembly is the generator's hot path.
    """
    slots = dict(fixed)
    if "noun" not in slots and "{noun}" in template:
        slots["noun"] = draw.pick(topic.nouns)
    if "adj" not in slots and "adj}" in template:
        slots["adj"] = draw.pick(topic.adjectives)
    if "{use}" in template:
        slots["use"] = draw.pick(topic.uses)
    if "{feat" in template:
        n = len(topic.features)
        f1 = draw.index(n)
        slots["feat"] = topic.features[f1]
        slots["feat2"] = topic.features[(f1 + 1 + draw.index(n - 1)) % n]
    if "adj}" in template:
        slots["a_adj"] = ("an " if slots["adj"][0] in "aeiou" else "a ") + slots["adj"]
        slots["A_adj"] = slots["a_adj"].capitalize()
    return template.format(category=topic.category, **slots)


def _sentences_to_length(draw: _Draw, first: str, pool: Iterable[str], last: str | None,
                         min_tokens: int, max_tokens: int) -> str:
    """Joins `first`, pool sentences (in order) and `last` until a random target length.

    The target lies in [min_tokens, max_tokens - 15]; sentences that would push the text over
    max_tokens are skipped, so the result lies in [min_tokens, max_tokens] whenever the pool
    is long enough (the tests check this on every generated text).
    """
    parts, total = [first], draw.tokens(first)
    tail = draw.tokens(last) if last else 0
    target = min_tokens + draw.index(max(1, max_tokens - 15 - min_tokens))
    for sentence in pool:
        if total + tail >= target:
            break
        n = draw.tokens(sentence)
        if total + n + tail <= max_tokens:
            parts.append(sentence)
            total += n
    if last:
        parts.append(last)
    return " ".join(parts)


def _make_item(draw: _Draw, idx: int, topic: Topic) -> Item:
    noun, adj = draw.pick(topic.nouns), draw.pick(topic.adjectives)
    title = f"{draw.pick(BRANDS)} {adj.capitalize()} {noun.title()} {idx % 97 + 1}"
    first = _fill(draw, DESCRIPTION_TEMPLATES[0], topic, title=title, adj=adj, noun=noun)
    order = [DESCRIPTION_TEMPLATES[1 + i] for i in draw.order(len(DESCRIPTION_TEMPLATES) - 1)]
    pool = itertools.chain((_fill(draw, t, topic, noun=noun, adj=adj) for t in order),
                           (_fill(draw, DESCRIPTION_TEMPLATES[2], topic) for _ in range(3)))
    description = _sentences_to_length(draw, first, pool, None, 40, 90)
    return Item(ItemId(f"i{idx:05d}"), title, description, topic.category)


def _make_review(draw: _Draw, topic: Topic, rating: int) -> str:
    noun = draw.pick(topic.nouns)
    first = draw.pick(REVIEW_OPENERS[rating]).format(noun=noun)
    body = (_fill(draw, REVIEW_BODY[i], topic, noun=noun) for i in draw.order(len(REVIEW_BODY)))
    pool = itertools.chain([draw.pick(topic.praise if rating >= 4 else topic.complaints)],
                           itertools.islice(body, 1),
                           [draw.pick(topic.praise if rating >= 3 else topic.complaints)], body)
    last = draw.pick(REVIEW_CLOSERS[rating >= 4])
    return _sentences_to_length(draw, first, pool, last, 20, 80)


def _weighted_sample(rng: np.random.Generator, pool: np.ndarray, weights: np.ndarray,
                     k: int) -> np.ndarray:
    """k distinct indices of `pool`, drawn successively ∝ weights (Efraimidis-Spirakis keys)."""
    keys = rng.exponential(size=pool.size) / weights[pool]
    return pool[np.argsort(keys)[:k]]


def _user_items(rng: np.random.Generator, length: int, own: np.ndarray,
                weights: np.ndarray, affinity: float) -> np.ndarray:
    """Distinct item indices: ~affinity of them from `own` (the user's topics' items), the
    rest by popularity over all items."""
    k_own = min(int(rng.binomial(length, affinity)), own.size)
    chosen = _weighted_sample(rng, own, weights, k_own)
    keys = rng.exponential(size=weights.size) / weights
    keys[chosen] = np.inf
    extra = np.argsort(keys)[:length - k_own]
    return rng.permutation(np.concatenate([chosen, extra]))


def generate(num_users: int = 200, num_items: int = 300, seed: int = 0, *,
             num_communities: int = 8, mean_history: float = 12.0, min_history: int = 3,
             max_history: int = 40, zipf_exponent: float = 1.0,
             community_affinity: float = 0.85) -> Dataset:
    """Generates a synthetic dataset; see the module docstring for its shape.

    Every user has between `min_history` and `max_history` interactions (mean ≈ mean_history),
    each with a distinct item. Raises RcllmError on impossible arguments.
    """
    if num_users < 1 or num_items < 2:
        raise RcllmError("synthetic: need num_users >= 1 and num_items >= 2")
    if not 1 <= num_communities <= len(TOPICS):
        raise RcllmError(f"synthetic: num_communities must be in 1..{len(TOPICS)}")
    if not 1 <= min_history <= max_history:
        raise RcllmError("synthetic: need 1 <= min_history <= max_history")
    if not 0.0 <= community_affinity <= 1.0:
        raise RcllmError("synthetic: community_affinity must be in [0, 1]")
    rng = np.random.default_rng(seed)
    community = rng.integers(0, num_communities, size=num_items)
    popularity_rank = rng.permutation(num_items) + 1
    weights = popularity_rank.astype(float) ** -zipf_exponent  # long tail

    draw = _Draw(rng)
    items = {}
    for idx in range(num_items):
        item = _make_item(draw, idx, TOPICS[community[idx]])
        items[item.item_id] = item
    item_ids = list(items)

    max_len = min(max_history, num_items)
    lengths = np.clip(min_history + rng.geometric(1.0 / max(1.0, mean_history - min_history + 1),
                                                  size=num_users) - 1, min_history, max_len)
    users: dict[UserId, list[HistoryEntry]] = {}
    pools: dict[tuple[int, ...], np.ndarray] = {}  # item indices per topic set, built lazily
    for u in range(num_users):
        topics = [int(rng.integers(num_communities))]
        if num_communities > 1 and rng.random() < 0.3:
            topics.append(int((topics[0] + 1 + rng.integers(num_communities - 1)) % num_communities))
        key = tuple(sorted(topics))
        if key not in pools:
            pools[key] = np.flatnonzero(np.isin(community, key))
        picked = _user_items(rng, int(lengths[u]), pools[key], weights, community_affinity)
        days = np.cumsum(rng.integers(0, 30, size=picked.size))  # 0-day gaps give ties
        start = _START_S + int(rng.integers(0, 3 * 365)) * _DAY_S
        ratings = rng.choice(_RATINGS, size=picked.size, p=_RATING_P)
        users[UserId(f"u{u:05d}")] = [
            HistoryEntry(item_ids[i], float(r), _make_review(draw, TOPICS[community[i]], int(r)),
                         start + int(d) * _DAY_S)
            for i, r, d in zip(picked, ratings, days)]
    return Dataset(name=f"synthetic-u{num_users}-i{num_items}-s{seed}", items=items, users=users)


def load(path: str = "", *, num_users: int = 200, num_items: int = 300, seed: int = 0,
         **options: int | float) -> Dataset:
    """The `load_dataset` entry point: `path` is ignored, the options go to `generate`."""
    del path  # nothing to read: the dataset is generated
    known = set(inspect.signature(generate).parameters)
    unknown = sorted(set(options) - known)
    if unknown:
        raise RcllmError(f"format 'synthetic' has no option(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    return generate(num_users, num_items, seed, **options)  # type: ignore[arg-type]
