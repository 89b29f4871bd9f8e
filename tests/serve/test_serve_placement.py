"""The served path's placement at start (`cluster_start.place_items`, issue 51 item 3), without
Ray: METIS or random shards of the same sizes, each instance's build order hot items last."""

from __future__ import annotations

import pytest

from rcllm.errors import RcllmError
from rcllm.serve.cluster_start import place_items
from rcllm.serve.router import RayBackend


def _placed(synthetic, how: str, seed: int = 0) -> tuple[list[list[str]], dict]:
    tokens = {str(i): 20 + len(str(i)) for i in synthetic.items}
    return place_items(synthetic, tokens, 2, 0.05, how, seed)


def test_random_placement_has_metis_sizes_and_hot_items_and_differs(synthetic):
    metis, m_info = _placed(synthetic, "metis")
    rand, r_info = _placed(synthetic, "random", seed=3)
    assert (m_info["method"], r_info["method"]) == ("metis", "random")
    assert m_info["hot_items"] == r_info["hot_items"] > 0
    assert m_info["shard_items"] == r_info["shard_items"]
    assert [len(h) for h in metis] == [len(h) for h in rand] == m_info["placed_items"]
    hot = set(metis[0]) & set(metis[1])
    assert hot == set(rand[0]) & set(rand[1]) and len(hot) == m_info["hot_items"]
    assert [set(h) for h in metis] != [set(h) for h in rand]
    # built hot items last, so a store smaller than the placement keeps them
    for held in (metis, rand):
        for items in held:
            assert set(items[-len(hot):]) == hot


def test_an_unknown_placement_is_refused_before_ray_starts():
    with pytest.raises(RcllmError, match="metis, random"):
        RayBackend(None, 2, 4, placement="nearest")
