"""Policy behaviour on hand-built clusters: the same objects the simulator and router use."""

import numpy as np
import pytest

from rcllm.routing import (ArrayLocality, ClusterView, CostModel, InstanceView, MethodConfig,
                            RequestShape, RoutingRequest, routing_policy)
from rcllm.routing.vidur_fit import builtin_profile

K = 4


@pytest.fixture()
def setup():
    profile = builtin_profile("qwen3-8b@a100")
    # items 0..9 live on instance 0, item i >= 10 on instance i % 4; item 99 is hot
    shard = np.array([0] * 10 + [i % K for i in range(10, 100)])
    is_hot = np.zeros(100, bool)
    is_hot[99] = True
    view = ClusterView(ArrayLocality(is_hot, shard, K), profile)
    items = np.arange(10)
    req = RoutingRequest(RequestShape(200, 60, 500, 450, 1000), items, np.full(10, 100))
    return view, req, CostModel(profile, MethodConfig("rcllm"))


def test_round_robin_cycles(setup):
    view, req, cost = setup
    rr = routing_policy("round-robin", cost)
    assert [rr.choose(req, view) for _ in range(6)] == [0, 1, 2, 3, 0, 1]


def test_load_only_picks_least_outstanding(setup):
    view, req, cost = setup
    view.outstanding_ms[:] = [50.0, 20.0, 5.0, 30.0]
    assert routing_policy("load-only", cost).choose(req, view) == 2


def test_hit_only_ignores_load(setup):
    view, req, cost = setup
    view.outstanding_ms[:] = [1e6, 0.0, 0.0, 0.0]
    assert routing_policy("hit-only", cost).choose(req, view) == 0


def test_affinity_trades_hits_for_idleness(setup):
    view, req, cost = setup
    aff = routing_policy("affinity", cost)
    view.outstanding_ms[:] = [10.0, 0.0, 0.0, 0.0]
    assert aff.choose(req, view) == 0           # a short queue is worth the hits
    view.outstanding_ms[:] = [5000.0, 0.0, 0.0, 0.0]
    assert aff.choose(req, view) != 0           # a long one is not
    assert routing_policy("affinity", cost, w_hit=1.0, w_idle=0.0).choose(req, view) == 0
    assert routing_policy("affinity", cost, w_hit=0.0, w_idle=1.0).choose(req, view) == 1


def test_cost_based_picks_lowest_estimated_ttft(setup):
    view, req, cost = setup
    view.outstanding_ms[:] = [30.0, 0.0, 0.0, 0.0]
    local = view.locality.local_tokens(req.items, req.item_tokens)
    expected = int(np.argmin(cost.ttft_ms(req.shape, local, view.outstanding_ms)))
    assert routing_policy("cost", cost).choose(req, view) == expected == 0
    view.outstanding_ms[:] = [500.0, 0.0, 0.0, 0.0]
    assert routing_policy("cost", cost).choose(req, view) == 1


def test_instance_views_give_same_decisions(setup):
    """One policy, two worlds: per-instance reports route like the simulator's arrays."""
    view, req, cost = setup
    view.outstanding_ms[:] = [40.0, 10.0, 0.0, 25.0]
    loc = view.locality
    instances = [InstanceView(k, 1, float(view.outstanding_ms[k]),
                              {i for i in range(100) if loc.is_hot[i] or loc.shard[i] == k},
                              view.profile) for k in range(K)]
    real = ClusterView.from_instances(instances)
    assert np.allclose(real.locality.local_tokens(req.items, req.item_tokens),
                       loc.local_tokens(req.items, req.item_tokens))
    for name in ("load-only", "hit-only", "affinity", "cost"):
        assert routing_policy(name, cost).choose(req, real) == routing_policy(name, cost).choose(req, view)
