"""Item-cache placement for the simulator: which instance holds which item's KV.

The simulator accepts any object with the `Placement` protocol (rcllm.sharding's METIS placement
has it) and turns it into the array form `ArrayLocality` routes with. Two placements of its own
need no graph partitioner: `hash` (hot replication + seeded random shards, the baseline that
ignores co-occurrence) and `community` (hot replication + the synthetic generator's
communities, an ideal co-occurrence partition that scales to 1M items).
"""

from __future__ import annotations

from typing import Hashable, Protocol

import numpy as np

from ..errors import RcllmError
from ..routing.views import ArrayLocality
from .workload import Workload

PLACEMENTS = ("metis", "hash", "community")


class Placement(Protocol):
    hot: frozenset
    shard_of: dict

    def instances_of(self, item_id: Hashable) -> frozenset[int]:
        ...


def hot_mask(workload: Workload, hot_fraction: float) -> np.ndarray:
    """The top ceil(hot_fraction · items) items by frequency in the placement trace."""
    n = workload.num_items
    count = int(np.ceil(hot_fraction * n)) if hot_fraction > 0 else 0
    freq = np.bincount(workload.placement_requests.ravel(), minlength=n)
    order = np.lexsort((np.arange(n), -freq))   # most frequent first, ties by index
    mask = np.zeros(n, bool)
    mask[order[:count]] = True
    return mask


def from_protocol(placement: Placement, num_items: int, num_instances: int,
                  seed: int = 0) -> ArrayLocality:
    """Array form of a placement over item indices 0..num_items-1 (keys are the indices).

    Items the placement never saw (absent from its trace) get a seeded random shard: their KV
    is precomputed offline and lives somewhere, just not where co-occurrence would put it.
    """
    rng = np.random.default_rng(seed)
    shard = rng.integers(0, num_instances, size=num_items)
    is_hot = np.zeros(num_items, bool)
    for item in placement.hot:
        is_hot[int(item)] = True
    for item, s in placement.shard_of.items():
        shard[int(item)] = int(s)
    return ArrayLocality(is_hot, shard, num_instances)


def _metis(workload: Workload, k: int, hot_fraction: float, seed: int) -> ArrayLocality:
    try:
        from rcllm.sharding.sharding import build_placement
    except ModuleNotFoundError:
        raise RcllmError("placement 'metis' needs rcllm.sharding; use 'hash' or 'community'")
    reqs = workload.placement_requests.tolist()
    seen = np.unique(workload.placement_requests)
    tokens = dict(zip(seen.tolist(), workload.item_tokens[seen].tolist()))
    # the catalog picks hot items among the items it sees; scale the fraction to the catalogue
    frac = min(1.0, hot_fraction * workload.num_items / max(len(seen), 1))
    placement = build_placement(reqs, tokens, k, hot_fraction=frac, method="metis", seed=seed)
    return from_protocol(placement, workload.num_items, k, seed)


def build_locality(workload: Workload, num_instances: int, method: str = "community",
                   hot_fraction: float = 0.001, seed: int = 0) -> ArrayLocality:
    """Hot replication of the top `hot_fraction` items + one shard per other item."""
    if num_instances < 1:
        raise RcllmError("num_instances must be >= 1")
    if method == "metis":
        return _metis(workload, num_instances, hot_fraction, seed)
    is_hot = hot_mask(workload, hot_fraction)
    if method == "hash":
        shard = np.random.default_rng(seed).integers(0, num_instances, size=workload.num_items)
    elif method == "community":
        if workload.community is None:
            raise RcllmError("placement 'community' needs a synthetic workload; use 'metis'")
        shard = workload.community % num_instances
    else:
        raise RcllmError(f"unknown placement {method!r}; known: {', '.join(PLACEMENTS)}")
    return ArrayLocality(is_hot, shard, num_instances)
