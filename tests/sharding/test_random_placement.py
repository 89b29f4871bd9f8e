"""Random shards with METIS's sizes (`sharding.shuffled_like`), the baseline METIS placement
is compared with on the served path (issue 51 item 3)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from rcllm.sharding import build_placement, shuffled_like


def _clustered(num_clusters=6, per_cluster=20, num_requests=400, seed=0):
    rng = np.random.default_rng(seed)
    reqs = []
    for _ in range(num_requests):
        c = int(rng.integers(num_clusters))
        reqs.append(["popular"] + [f"c{c}_{j}" for j in rng.choice(per_cluster, 6, replace=False)])
    tokens = {f"c{c}_{j}": int(rng.integers(10, 60)) for c in range(num_clusters)
              for j in range(per_cluster)}
    tokens["popular"] = 40
    return reqs, tokens


def test_random_shards_keep_metis_sizes_and_hot_set_but_not_its_partition():
    reqs, tokens = _clustered()
    metis = build_placement(reqs, tokens, 3, hot_fraction=0.01, method="metis")
    rand = shuffled_like(metis, seed=1)
    rand.check_invariants()
    assert rand.method == "random" and rand.hot == metis.hot == frozenset({"popular"})
    assert set(rand.shard_of) == set(metis.shard_of)                  # every tail item placed
    assert Counter(rand.shard_of.values()) == Counter(metis.shard_of.values())   # same sizes
    moved = sum(rand.shard_of[i] != metis.shard_of[i] for i in metis.shard_of)
    assert moved > len(metis.shard_of) // 3
    # co-location is what METIS buys: its best instance holds more of a request's items
    assert (metis.local_hit_rate(reqs, include_hot=False)
            > rand.local_hit_rate(reqs, include_hot=False) + 0.2)
    assert shuffled_like(metis, seed=1) == rand                       # seeded
    assert shuffled_like(metis, seed=2) != rand
