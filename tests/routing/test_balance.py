"""Affinity's balance between hits and load derived from the cost model (routing/balance.py,
issue 51 item 2), on hand-built clusters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rcllm.routing import (ArrayLocality, ClusterView, CostModel, MethodConfig, RequestShape,
                           RoutingRequest, cpu_smollm2_profile, routing_policy)
from rcllm.routing.balance import decision_weight, idle_weight, miss_cost_ms, miss_ms

SHAPE = RequestShape(prefix_tokens=60, fresh_tokens=20, history_tokens=300,
                     history_hit_tokens=0, item_tokens=1000)


@pytest.fixture()
def cost():
    return CostModel(cpu_smollm2_profile(), MethodConfig("rcllm"))


def test_the_weight_moves_the_way_the_cost_model_says(cost):
    base = idle_weight(cost, SHAPE, 0.5, 200.0)
    # a longer queue is worth more hits: load weighs more
    assert idle_weight(cost, SHAPE, 0.5, 2000.0) > base
    # dearer misses (more item tokens to recompute) make hits weigh more
    longer = RequestShape(60, 20, 300, 0, 3000)
    assert miss_ms(cost, longer) > miss_ms(cost, SHAPE) > 0
    assert idle_weight(cost, longer, 0.5, 200.0) < base
    # a smaller share of the items at the best instance: each hit is a larger relative gain
    assert idle_weight(cost, SHAPE, 0.05, 200.0) > base
    # misses that cost nothing (a method that reuses no item): load alone decides
    full = CostModel(cpu_smollm2_profile(), MethodConfig("full"))
    assert math.isinf(idle_weight(full, SHAPE, 0.5, 200.0))


def _cluster(k: int, cost, seed: int = 0, n_items: int = 4000):
    """k instances, items sharded at random (2% hot), requests of 20 random items."""
    rng = np.random.default_rng(seed)
    is_hot = np.zeros(n_items, bool)
    is_hot[rng.choice(n_items, n_items // 50, replace=False)] = True
    view = ClusterView(ArrayLocality(is_hot, rng.integers(0, k, n_items), k), cost.profile)
    view.outstanding_ms[:] = rng.uniform(0, 400, k)
    reqs = [RoutingRequest(SHAPE, rng.choice(n_items, 20, replace=False), np.full(20, 50))
            for _ in range(200)]
    return view, reqs


def test_more_instances_derive_a_heavier_idleness_weight(cost):
    """At 40 instances a request's best instance holds a smaller share of its items than at 2,
    so the derived weight on load is larger; a fixed weight cannot be right for both."""
    best_hit, weight = {}, {}
    for k in (2, 40):
        view, reqs = _cluster(k, cost)
        local = [view.locality.local_tokens(r.items, r.item_tokens) for r in reqs]
        best_hit[k] = np.mean([loc.max() / 1000 for loc in local])
        weight[k] = np.median([decision_weight(cost, SHAPE, loc, view.outstanding_ms)
                               for loc in local])
    assert best_hit[2] > best_hit[40]
    assert weight[40] > 2 * weight[2]


def test_derived_affinity_follows_the_cost_model_where_a_fixed_weight_does_not(cost):
    """2 instances: instance 0 holds 60% of the request's item tokens and has a short queue,
    instance 1 holds 40% and is idle. The queue costs less than the extra misses, so the
    cost model picks 0; affinity with the fixed weight 4 (tuned for 40 instances) picks 1."""
    shard = np.array([0] * 12 + [1] * 8)
    view = ClusterView(ArrayLocality(np.zeros(20, bool), shard, 2), cost.profile)
    req = RoutingRequest(SHAPE, np.arange(20), np.full(20, 50))
    breakeven = float(cost.service_ms(cost.work(SHAPE, 400))
                      - cost.service_ms(cost.work(SHAPE, 600)))
    view.outstanding_ms[:] = [0.9 * breakeven, 0.0]
    local = view.locality.local_tokens(req.items, req.item_tokens)
    ttft = cost.ttft_ms(SHAPE, local, view.outstanding_ms)
    assert ttft[0] < ttft[1]
    assert routing_policy("cost", cost).choose(req, view) == int(np.argmin(ttft)) == 0
    assert routing_policy("affinity", cost, w_idle=4.0).choose(req, view) == 1
    assert routing_policy("affinity", cost, w_idle=None).choose(req, view) == 0
    # past the break-even the queue wins under both
    view.outstanding_ms[:] = [1.5 * breakeven, 0.0]
    assert routing_policy("affinity", cost, w_idle=None).choose(req, view) == 1
    assert routing_policy("cost", cost).choose(req, view) == 1


def test_the_ttft_of_missed_item_tokens(cost):
    assert miss_cost_ms(cost, 1400, 1000, 0) == 0.0
    half, every = miss_cost_ms(cost, 1400, 1000, 500), miss_cost_ms(cost, 1400, 1000, 1000)
    assert 0 < half < every
    assert every == pytest.approx(miss_ms(cost, RequestShape(0, 400, 0, 0, 1000)))
    assert miss_cost_ms(cost, 1400, 1000, 5000) == every      # clipped to the items


def test_the_simulator_runs_affinity_with_the_derived_weight():
    """`SimConfig.w_idle=None` reaches the simulator's policy: at 2 instances the derived
    weight routes differently from the fixed 4, and on more hits."""
    from rcllm.sim import (SimConfig, SyntheticSpec, build_locality, poisson_arrivals_ms,
                           simulate, synthetic_workload)

    w = synthetic_workload(SyntheticSpec(num_items=2000, num_requests=600, num_communities=8,
                                         placement_requests=600))
    profile = cpu_smollm2_profile()
    loc = build_locality(w, 2, "community")
    arrivals = poisson_arrivals_ms(np.random.default_rng(0), w.num_requests, 0.5)
    runs = {}
    for weight in (4.0, None):
        res = simulate(w, arrivals, loc, profile, SimConfig(MethodConfig("rcllm"),
                                                            w_idle=weight))
        res.check_invariants()
        runs[weight] = res
    assert np.any(runs[None].instance != runs[4.0].instance)
    assert runs[None].item_hit_rate.mean() > runs[4.0].item_hit_rate.mean()
