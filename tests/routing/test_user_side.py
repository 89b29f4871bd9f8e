"""Routing by user side (issue 60 item 3, the relay): `user-side` sends a ranking to the
instance holding its user's side, balanced against load as prefix-aware is; exact-user's
series is routed by it. Pure Python."""

from __future__ import annotations

import pytest

from rcllm.errors import RcllmError
from rcllm.routing import ClusterView, SetLocality, cpu_smollm2_profile, routing_policy
from rcllm.routing.registry import ITEM_POLICIES, POLICIES, REGISTRY, method_policy
from rcllm.routing.requests import routing_request, user_key


def _request(user="u", pointwise=True):
    return routing_request({"user_id": user, "history": [], "candidates": ["a", "b"]},
                           {"a": 30, "b": 30}, user_side=pointwise, history_window=10)


def _view(home: int | None, queue=(0, 0, 0), items=("a", "b")) -> ClusterView:
    held = [set(items) | ({user_key("u")} if k == home else set()) for k in range(3)]
    view = ClusterView(SetLocality(held), cpu_smollm2_profile())
    view.queue_depth[:] = queue
    view.outstanding_ms[:] = [100.0 * q for q in queue]
    return view


def test_the_ranking_goes_where_its_user_side_is_unless_that_queue_is_longer():
    pol = routing_policy("user-side", None)
    assert pol.choose(_request(), _view(2)) == 2
    assert pol.choose(_request(), _view(2, queue=(0, 0, 1))) == 2     # one more: still home
    assert pol.choose(_request(), _view(2, queue=(0, 1, 2))) == 0     # two more: by load
    # a user no instance holds (or another user's request) goes by load, ties rotating
    assert {pol.choose(_request(), _view(None)) for _ in range(3)} == {0, 1, 2}
    assert pol.choose(_request("v"), _view(2, queue=(1, 0, 1))) == 1


def test_a_request_without_a_user_side_is_refused():
    with pytest.raises(RcllmError, match="user side"):
        routing_policy("user-side", None).choose(_request(pointwise=False), _view(0))


def test_exact_user_is_routed_by_its_user_side_and_the_simulator_does_not_run_it():
    assert method_policy("exact-user") == "user-side" and REGISTRY["user-side"].reads == "users"
    assert "user-side" in POLICIES and "user-side" not in ITEM_POLICIES
    assert [method_policy(m) for m in ("full", "prefix", "rcllm")] == [
        "load-only", "prefix-aware", "affinity"]
