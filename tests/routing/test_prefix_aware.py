"""Prefix caching as deployed (issue 60 item 2): the router's picture of the instances' prefix
caches (`routing.prefixes.PrefixIndex`) and the prefix-aware policy over it, pure Python."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.errors import RcllmError
from rcllm.routing import ClusterView, SetLocality, cpu_smollm2_profile, routing_policy
from rcllm.routing.prefixes import PrefixIndex, PrefixView, prefix_chain
from rcllm.routing.registry import CACHE_BLIND, ITEM_POLICIES, POLICIES, REGISTRY, method_policy
from rcllm.routing.requests import routing_request

COST = None     # prefix-aware and load-only read no cost model


def _history(n: int, day: int = 0) -> list[dict]:
    return [{"item_id": f"h{k}", "rating": 4, "review": "", "timestamp": k + day}
            for k in range(n)]


def _request(history, candidates=("a", "b"), pointwise=False):
    return routing_request({"user_id": "u", "history": history, "candidates": list(candidates)},
                           {"a": 30, "b": 30}, user_side=pointwise, history_window=10)


def _view(index: PrefixIndex, queue=(0, 0, 0), order=(0, 1, 2)) -> ClusterView:
    view = ClusterView(SetLocality([set() for _ in order]), cpu_smollm2_profile(),
                       PrefixView(index, order))
    view.queue_depth[:] = queue
    view.outstanding_ms[:] = [100.0 * q for q in queue]
    return view


def test_a_chain_key_stands_for_its_whole_prefix():
    a, b = prefix_chain(["x", "y", "z"]), prefix_chain(["x", "q", "z"])
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]
    assert prefix_chain(["x", "y"]) == a[:2]                     # stable across calls


def test_the_match_is_the_longest_held_chain_and_capacity_evicts_the_oldest():
    idx = PrefixIndex(3, capacity_tokens=1000)
    old, grown = _request(_history(3)), _request(_history(5))
    idx.insert(1, old.prefix, old.prefix_tokens)
    # a returning user's grown history: the earlier prompt's history is matched on instance 1
    # (the candidates differ in place after it: listwise, they follow the history)
    m = idx.matched_tokens(grown.prefix, grown.prefix_tokens)
    assert m.tolist() == [0, 3 * 60, 0]
    # a pointwise prompt's prefix ends with the history; a slid window matches nothing
    assert len(_request(_history(4), pointwise=True).prefix) == 4
    slid = _request(_history(12)[2:])
    assert idx.matched_tokens(slid.prefix, slid.prefix_tokens).max() == 0
    for day in range(1, 6):                 # 5 more prompts of 240 tokens: over 1000
        r = _request(_history(3, day))
        idx.insert(1, r.prefix, r.prefix_tokens)
        idx.check_invariants()
    assert idx.held_tokens(1) <= 1000
    assert idx.matched_tokens(grown.prefix, grown.prefix_tokens)[1] == 0     # evicted
    idx.forget(1)
    assert idx.held_tokens(1) == 0


def test_prefix_aware_prefers_the_longest_match_unless_its_queue_is_longer():
    idx = PrefixIndex(3, capacity_tokens=10_000)
    short, full = _request(_history(2)), _request(_history(6))
    idx.insert(0, short.prefix, short.prefix_tokens)
    idx.insert(2, full.prefix, full.prefix_tokens)
    pol = routing_policy("prefix-aware", COST)
    assert pol.choose(full, _view(idx)) == 2                      # the longest match
    assert pol.choose(full, _view(idx, queue=(0, 0, 1))) == 2     # one request more: kept
    assert pol.choose(full, _view(idx, queue=(0, 0, 2))) == 0     # two more: load decides
    assert pol.choose(full, _view(idx, queue=(1, 0, 2))) == 1
    # no instance holds any of it: load-only (ties rotate)
    new = _request(_history(4, day=9))
    picks = {pol.choose(new, _view(idx)) for _ in range(3)}
    assert picks == {0, 1, 2}
    # the view's order is the live instances' (instance 1 dead: positions 0, 1 = 0, 2)
    assert pol.choose(full, _view(idx, queue=(0, 0), order=(0, 2))) == 1


def test_prefix_aware_refuses_a_view_without_a_prefix_picture():
    view = ClusterView(SetLocality([set(), set()]), cpu_smollm2_profile())
    with pytest.raises(RcllmError, match="prefix picture"):
        routing_policy("prefix-aware", COST).choose(_request(_history(2)), view)


def test_the_registry_is_the_one_list():
    assert POLICIES == tuple(REGISTRY) and "prefix-aware" in POLICIES
    assert "prefix-aware" not in ITEM_POLICIES and set(CACHE_BLIND) == {"round-robin",
                                                                        "load-only"}
    assert [method_policy(m) for m in ("full", "prefix", "rcllm")] == [
        "load-only", "prefix-aware", "affinity"]
    assert all(routing_policy(n, COST if REGISTRY[n].reads in ("order", "load", "prefixes")
                              else _cost()).name == n for n in POLICIES)
    with pytest.raises(RcllmError, match="known: round-robin"):
        routing_policy("nearest", COST)


def _cost():
    from rcllm.routing import CostModel, MethodConfig

    return CostModel(cpu_smollm2_profile(), MethodConfig())


def test_matched_tokens_of_a_subset_follow_its_order():
    idx = PrefixIndex(2, 100)
    idx.insert(1, (7, 8), (10, 20))
    assert np.array_equal(idx.matched_tokens((7, 8, 9), (10, 20, 5), [1, 0]), [30, 0])
