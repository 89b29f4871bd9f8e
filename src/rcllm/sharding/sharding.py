"""Item placement across instances: hot items replicated everywhere, the rest sharded.

RcLLM's item-catalog cache (PAPERS.md §1): the hottest `hot_fraction` of items is replicated
on every instance; the long tail is partitioned into K shards so that items that co-occur in
requests live on the same instance (METIS on the co-occurrence graph, node weight = the item's
token count so shards hold similar numbers of KV tokens). Random and hash sharding are the
baselines that ignore co-occurrence.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

import numpy as np

from ..errors import RcllmError
from .graph import build_cooccurrence

ItemKey = Hashable  # rcllm.records.ItemId in practice; any hashable works
METHODS = ("metis", "random", "hash")


@dataclass(frozen=True)
class Placement:
    """Where each item's KV lives.

    hot: items replicated on every instance. shard_of: non-hot item → its one instance
    (0..num_instances-1). An item in neither is cached nowhere (always a miss).
    token_counts: the token count used for every item-weighted figure below.
    """

    num_instances: int
    hot: frozenset
    shard_of: Mapping[ItemKey, int]
    token_counts: Mapping[ItemKey, int]
    method: str = "metis"
    _hot_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hot_tokens", sum(self.tokens(i) for i in self.hot))

    def tokens(self, item: ItemKey) -> int:
        """Token count of `item` (1 when unknown, so unknown items still count as misses)."""
        return int(self.token_counts.get(item, 1))

    def instances_of(self, item: ItemKey) -> frozenset[int]:
        """Instances whose cache holds `item`'s KV: all for hot items, one for sharded items,
        none for items the placement has never seen."""
        if item in self.hot:
            return frozenset(range(self.num_instances))
        shard = self.shard_of.get(item)
        return frozenset() if shard is None else frozenset((shard,))

    def shard_items(self) -> list[list[ItemKey]]:
        """Non-hot items of each shard, index = instance."""
        out: list[list[ItemKey]] = [[] for _ in range(self.num_instances)]
        for item, shard in self.shard_of.items():
            out[shard].append(item)
        return out

    def shard_tokens(self) -> list[int]:
        """Tokens of the non-hot items on each instance."""
        out = [0] * self.num_instances
        for item, shard in self.shard_of.items():
            out[shard] += self.tokens(item)
        return out

    def instance_tokens(self) -> list[int]:
        """Tokens cached on each instance: its shard plus every hot replica."""
        return [t + self._hot_tokens for t in self.shard_tokens()]

    def best_instance(self, items: Sequence[ItemKey],
                      include_hot: bool = True) -> tuple[int, int, int]:
        """(instance, cached tokens there, total tokens) for the instance holding most of
        `items`' tokens (ties → lowest index). Duplicate items count once."""
        per = np.zeros(self.num_instances, dtype=np.int64)
        total = hot = 0
        for item in dict.fromkeys(items):
            if item in self.hot:
                if include_hot:
                    tok = self.tokens(item)
                    hot += tok
                    total += tok
                continue
            tok = self.tokens(item)
            total += tok
            shard = self.shard_of.get(item)
            if shard is not None:
                per[shard] += tok
        best = int(np.argmax(per))
        return best, int(per[best]) + hot, total

    def local_hit_rate(self, requests: Sequence[Sequence[ItemKey]],
                       include_hot: bool = True) -> float:
        """Token-weighted fraction of requested item tokens cached on each request's best
        instance, summed over requests. include_hot=False restricts to non-hot items (the
        part sharding decides). NaN when the requests have no tokens."""
        cached = total = 0
        for req in requests:
            _, c, t = self.best_instance(req, include_hot)
            cached += c
            total += t
        return cached / total if total else float("nan")

    def check_invariants(self) -> None:
        assert self.num_instances >= 1
        assert not (self.hot & set(self.shard_of)), "an item is both hot and sharded"
        assert all(0 <= s < self.num_instances for s in self.shard_of.values()), "bad shard id"


def hot_items(requests: Sequence[Sequence[ItemKey]], items: Sequence[ItemKey],
              hot_fraction: float) -> frozenset:
    """The max(1, floor(hot_fraction × len(items))) items appearing in the most requests
    (ties → first in `items`); hot_fraction == 0 disables replication."""
    if not 0.0 <= hot_fraction <= 1.0:
        raise RcllmError(f"hot_fraction must be in [0, 1], got {hot_fraction}")
    if hot_fraction == 0.0 or not items:
        return frozenset()
    count = min(len(items), max(1, int(hot_fraction * len(items))))
    freq = {item: 0 for item in items}
    for req in requests:
        for item in set(req):
            if item in freq:
                freq[item] += 1
    order = sorted(range(len(items)), key=lambda i: (-freq[items[i]], i))
    return frozenset(items[i] for i in order[:count])


def _metis(requests, items: list, token_counts, k: int, seed: int) -> list[int]:
    import pymetis  # imported here: only this method needs it

    graph = build_cooccurrence(requests, nodes=items)
    vweights = [max(1, int(token_counts.get(i, 1))) for i in items]
    opts = pymetis.Options(seed=seed, ufactor=30)
    adjacency = pymetis.CSRAdjacency(graph.xadj.tolist(), graph.adjncy.tolist())
    _, parts = pymetis.part_graph(k, adjacency, vweights=vweights,
                                  eweights=graph.eweights.tolist(), options=opts)
    return list(parts)


def _hash_shard(item: ItemKey, k: int) -> int:
    digest = hashlib.blake2b(str(item).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % k


def build_placement(requests: list[list[ItemKey]], token_counts: dict[ItemKey, int],
                    num_instances: int, hot_fraction: float = 0.001, method: str = "metis",
                    seed: int = 0) -> Placement:
    """Places every item of `token_counts` ∪ `requests` on `num_instances` instances.

    requests: item lists seen together (training trace). token_counts: tokens per item (node
    weights; items only in requests get 1). method: "metis" (co-occurrence partition, balanced
    by tokens), "random" (seeded uniform) or "hash" (blake2b of the id mod K). Deterministic for
    a given seed. Raises RcllmError on a bad method or instance count.
    """
    if num_instances < 1:
        raise RcllmError(f"num_instances must be >= 1, got {num_instances}")
    if method not in METHODS:
        raise RcllmError(f"unknown sharding method {method!r}; choose from {', '.join(METHODS)}")
    items = list(dict.fromkeys(list(token_counts) + [i for r in requests for i in r]))
    hot = hot_items(requests, items, hot_fraction)
    rest = [i for i in items if i not in hot]
    k = num_instances
    if k == 1 or not rest:
        shards = [0] * len(rest)
    elif method == "random":
        shards = np.random.default_rng(seed).integers(0, k, size=len(rest)).tolist()
    elif method == "hash":
        shards = [_hash_shard(i, k) for i in rest]
    elif len(rest) <= k:
        shards = list(range(len(rest)))  # METIS needs more nodes than parts
    else:
        shards = _metis(requests, rest, token_counts, k, seed)
    return Placement(k, hot, dict(zip(rest, (int(s) for s in shards))), dict(token_counts),
                     method)


def shuffled_like(placement: Placement, seed: int = 0) -> Placement:
    """The baseline of `placement` that ignores co-occurrence: the same hot items, the same
    number of items on every shard, but which tail item goes to which shard drawn at random
    (seeded). Compared with METIS under the same router, only co-location differs (sizes and
    replication do not), so a difference in hits is what METIS's partition buys."""
    shards = placement.shard_items()
    tail = sorted(placement.shard_of, key=str)          # a seed-only order, not METIS's
    order = np.random.default_rng(seed).permutation(len(tail))
    shard_of: dict[ItemKey, int] = {}
    at = 0
    for k, members in enumerate(shards):
        for j in order[at:at + len(members)]:
            shard_of[tail[int(j)]] = k
        at += len(members)
    return Placement(placement.num_instances, placement.hot, shard_of,
                     dict(placement.token_counts), "random")

