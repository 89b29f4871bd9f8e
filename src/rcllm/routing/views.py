"""Plain views of instances that routing policies read.

`InstanceView` is what a real deployment reports per instance (queue, outstanding work,
cached items, speed). `ClusterView` is the array form policies actually use: per-instance
outstanding work and queue depth, plus a `Locality` that says how many of a request's item
tokens each instance holds. The simulator keeps one `ClusterView` and updates its arrays in
place; policies must treat it as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Hashable, Protocol, Sequence

import numpy as np

from .cost import RequestShape
from .profiles import SpeedProfile


@dataclass(frozen=True)
class InstanceView:
    """One instance as the router sees it."""

    instance_id: int
    queue_depth: int              # requests waiting or running
    outstanding_ms: float         # estimated time until its queue drains
    cached_items: Collection[Hashable]   # items whose KV is in this instance's memory
    profile: SpeedProfile


@dataclass(frozen=True)
class RoutingRequest:
    """What a policy knows of a request: its shape and its candidate items with token counts;
    for prefix-aware routing, its prompt's prefix chain (`prefixes.prefix_chain`) with the
    tokens of each segment (empty where the caller builds none: the simulator's requests)."""

    shape: RequestShape
    items: Sequence[Hashable] | np.ndarray
    item_tokens: np.ndarray       # int, aligned with items
    prefix: tuple[int, ...] = ()
    prefix_tokens: tuple[int, ...] = ()     # aligned with prefix


class Locality(Protocol):
    """Where item KV lives."""

    num_instances: int

    def local_tokens(self, items: Sequence[Hashable] | np.ndarray,
                     item_tokens: np.ndarray) -> np.ndarray:
        """Item tokens of `items` held by each instance: float array of shape [K]."""
        ...


class SetLocality:
    """Locality from per-instance cached item sets (the general, slower form)."""

    def __init__(self, cached: Sequence[Collection[Hashable]]) -> None:
        self._cached = list(cached)
        self.num_instances = len(self._cached)

    def local_tokens(self, items, item_tokens) -> np.ndarray:
        out = np.zeros(self.num_instances)
        for k, held in enumerate(self._cached):
            out[k] = sum(int(t) for it, t in zip(items, item_tokens) if it in held)
        return out


class ArrayLocality:
    """Locality for hot replication + one shard per item, over integer item indices.

    `is_hot[i]`: item i is on every instance; otherwise it lives on `shard[i]` only. One
    `np.bincount` per request: fast enough for a 100-instance routing decision in microseconds.
    """

    def __init__(self, is_hot: np.ndarray, shard: np.ndarray, num_instances: int) -> None:
        self.is_hot = np.asarray(is_hot, bool)
        self.shard = np.asarray(shard, np.int64)
        self.num_instances = int(num_instances)

    def local_tokens(self, items, item_tokens) -> np.ndarray:
        items = np.asarray(items)
        tokens = np.asarray(item_tokens, float)
        hot = self.is_hot[items]
        cold = ~hot
        out = np.bincount(self.shard[items[cold]], weights=tokens[cold],
                          minlength=self.num_instances).astype(float, copy=False)
        out += tokens[hot].sum()
        return out


class PrefixLocality(Protocol):
    """Which prompt prefixes each instance's prefix cache holds (`prefixes.PrefixView`)."""

    num_instances: int

    def matched_tokens(self, keys: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Tokens of the longest held prefix of chain `keys` per instance: float [K]."""
        ...


class ClusterView:
    """Per-instance load arrays plus item locality, and (where the caller keeps one) the
    prefix caches' picture; the simulator mutates the arrays."""

    def __init__(self, locality: Locality, profile: SpeedProfile,
                 prefixes: PrefixLocality | None = None) -> None:
        k = locality.num_instances
        if prefixes is not None and prefixes.num_instances != k:
            raise ValueError("the prefix picture and the locality differ in instances")
        self.locality = locality
        self.profile = profile
        self.prefixes = prefixes      # None: no prefix picture (prefix-aware cannot route)
        self.outstanding_ms = np.zeros(k)
        self.queue_depth = np.zeros(k, dtype=np.int64)

    @property
    def num_instances(self) -> int:
        return self.locality.num_instances

    @classmethod
    def from_instances(cls, instances: Sequence[InstanceView],
                       prefixes: PrefixLocality | None = None) -> "ClusterView":
        """Builds the array view from per-instance reports (the real deployment's path)."""
        view = cls(SetLocality([i.cached_items for i in instances]), instances[0].profile,
                   prefixes)
        for k, inst in enumerate(instances):
            view.outstanding_ms[k] = inst.outstanding_ms
            view.queue_depth[k] = inst.queue_depth
        return view
