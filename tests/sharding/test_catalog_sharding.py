import numpy as np
import pytest

from rcllm.sharding import build_cooccurrence, build_placement, estimate_tokens, hot_items
from rcllm.errors import RcllmError


def _clustered(num_clusters=8, per_cluster=30, num_requests=600, seed=0):
    """Requests drawn from disjoint item clusters, plus one item in every request."""
    rng = np.random.default_rng(seed)
    reqs = []
    for _ in range(num_requests):
        c = int(rng.integers(num_clusters))
        picks = rng.choice(per_cluster, 8, replace=False)
        reqs.append(["popular"] + [f"c{c}_{j}" for j in picks])
    tokens = {f"c{c}_{j}": int(rng.integers(10, 100))
              for c in range(num_clusters) for j in range(per_cluster)}
    tokens["popular"] = 50
    return reqs, tokens


def test_graph_counts_pairs_once_per_request_and_is_symmetric():
    g = build_cooccurrence([["a", "b", "c"], ["a", "b", "b"], ["d"]])
    g.check_invariants()
    idx = {n: i for i, n in enumerate(g.nodes)}
    assert g.edge_weight(idx["a"], idx["b"]) == 2
    assert g.edge_weight(idx["b"], idx["c"]) == 1
    assert g.edge_weight(idx["a"], idx["d"]) == 0
    assert g.frequency[idx["b"]] == 2 and g.frequency[idx["d"]] == 1
    assert g.num_edges == 3


def test_hot_items_at_least_one_and_most_frequent():
    reqs, tokens = _clustered()
    assert hot_items(reqs, list(tokens), 0.001) == frozenset({"popular"})
    assert hot_items(reqs, list(tokens), 0.0) == frozenset()
    assert len(hot_items(reqs, list(tokens), 0.05)) == int(0.05 * len(tokens))


def test_placement_api_and_hot_replication():
    reqs, tokens = _clustered()
    p = build_placement(reqs, tokens, num_instances=4)
    p.check_invariants()
    assert p.hot == frozenset({"popular"})
    assert p.instances_of("popular") == frozenset(range(4))
    assert len(p.instances_of("c0_0")) == 1
    assert p.instances_of("never-seen") == frozenset()
    assert set(p.shard_of) | p.hot == set(tokens)
    assert sum(p.shard_tokens()) == sum(tokens.values()) - 50
    assert all(t == s + 50 for t, s in zip(p.instance_tokens(), p.shard_tokens()))
    assert sum(len(s) for s in p.shard_items()) == len(tokens) - 1


def test_metis_beats_random_on_clustered_traces_and_stays_balanced():
    reqs, tokens = _clustered()
    train, held = reqs[:450], reqs[450:]
    metis = build_placement(train, tokens, 8, method="metis")
    rand = build_placement(train, tokens, 8, method="random")
    hashed = build_placement(train, tokens, 8, method="hash")
    m, r = metis.local_hit_rate(held, False), rand.local_hit_rate(held, False)
    assert m >= 1.5 * r
    assert m > 0.9
    assert hashed.local_hit_rate(held, False) < m
    shard = metis.shard_tokens()
    assert max(shard) <= 1.3 * (sum(shard) / len(shard))


def test_single_instance_holds_everything_and_hit_rate_is_one():
    reqs, tokens = _clustered()
    p = build_placement(reqs, tokens, 1)
    assert p.local_hit_rate(reqs) == pytest.approx(1.0)
    assert p.instance_tokens() == [sum(tokens.values())]


def test_unknown_items_are_misses_and_hot_counts_when_included():
    p = build_placement([["a", "b"]], {"a": 10, "b": 30}, 2, hot_fraction=0.5)
    assert p.hot == frozenset({"a"})  # tie on frequency → first item
    assert p.local_hit_rate([["a", "b", "zzz"]]) == pytest.approx(40 / 41)
    assert p.local_hit_rate([["a", "zzz"]], include_hot=False) == 0.0


def test_deterministic_per_seed_and_bad_inputs_raise():
    reqs, tokens = _clustered()
    a = build_placement(reqs, tokens, 5, method="random", seed=3)
    b = build_placement(reqs, tokens, 5, method="random", seed=3)
    assert a.shard_of == b.shard_of
    with pytest.raises(RcllmError):
        build_placement(reqs, tokens, 0)
    with pytest.raises(RcllmError):
        build_placement(reqs, tokens, 2, method="nope")


def test_more_instances_than_items():
    p = build_placement([["a", "b", "c"]], {"a": 1, "b": 1, "c": 1}, 10, hot_fraction=0.0)
    p.check_invariants()
    assert sorted(p.shard_of.values()) == [0, 1, 2]


def test_token_estimate():
    assert estimate_tokens("") == 1
    assert estimate_tokens("one two three four five six seven eight nine ten") == 13
