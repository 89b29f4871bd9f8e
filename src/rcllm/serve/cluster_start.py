"""What a Ray deployment (`router.RayBackend`) does at start: Ray itself, and which items each
instance builds.

Placement: item KV is sharded over instances with `sharding.build_placement` (METIS on the
co-occurrence of the dataset's user histories, hottest `hot_fraction` replicated), or with
`placement="random"` the same hot items and shard sizes with the tail drawn at random
(`sharding.shuffled_like`, seeded), so the two compare under one router. Each instance builds
its shard and the hot items least requested first, so a store smaller than them keeps the hot
items and its shard's most requested ones.
"""

from __future__ import annotations

import os
from collections import Counter

from ..records import Dataset
from ..sharding.sharding import build_placement, shuffled_like

PLACEMENTS = ("metis", "random")     # how the tail of the catalog is sharded at start


def init_ray(address: str | None, object_store_bytes: int) -> bool:
    """Starts (or joins, with `address`) Ray unless this process already did; True when this
    call initialised it (the backend then shuts it down on close)."""
    import ray

    if ray.is_initialized():
        return False
    local = {} if address else {"num_cpus": os.cpu_count() or 2,
                                "object_store_memory": object_store_bytes}
    if not address:
        # Ray runs its workers at nice 15 by default: the engines would then get ~3% of a
        # core beside any ordinary process (the router in this process, a client, another
        # job), and a busy machine starves the answers. The engines are the service, so they
        # run at this process's priority.
        local["_system_config"] = {"worker_niceness": 0}
    ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
    return True


def place_items(ds: Dataset, item_tokens: dict[str, int], k: int, hot_fraction: float,
                how: str, seed: int) -> tuple[list[list[str]], dict]:
    """Items whose KV each of `k` instances builds at start, in build order (module
    docstring), and what was placed (`placement_info`: method, seed, hot items, shard and
    placed sizes, and `placed`: each instance's items in build order, which the simulator
    replays). `how`: metis, or random (METIS's hot items and shard sizes, the tail
    drawn at random with `seed`)."""
    trace = [[str(h.item_id) for h in hist] for hist in ds.users.values()]
    placement = build_placement(trace, dict(item_tokens), k, hot_fraction,
                                method="metis" if k > 1 else "hash")
    if how == "random":
        placement = shuffled_like(placement, seed)
    requested = Counter(item for items in trace for item in set(items))
    shards = placement.shard_items()
    held = [sorted(set(shards[i]) | set(placement.hot),
                   key=lambda it: (it in placement.hot, requested[it], it))
            for i in range(k)]
    info = {"method": how, "seed": seed, "hot_items": len(placement.hot),
            "shard_items": [len(s) for s in shards], "placed_items": [len(h) for h in held],
            "placed": held}
    return held, info


def warm(actors, held: list[list[str]], tier) -> tuple[list[list[str]], list[int]]:
    """Builds each instance's placed items (`actors`: `actors.InstanceActors`); returns what
    the router counts as held, what each store kept of its placement (a shard larger than the
    store keeps only its last-built part), and how many that is per instance. Beside a shared
    tier (`tier`, None: none), what the tier kept joins its picture."""
    import ray

    ray.get([a.build_items.remote(items) for a, items in zip(actors.handles, held)])
    kept = actors.get_all("cached_items")
    held = [sorted(set(h).intersection(k)) for h, k in zip(held, kept)]
    if tier is not None:
        tier.added(tier.present())
    return held, [len(h) for h in held]
