"""`rcllm sim bench`: simulator throughput and routing-decision latency, printed."""

from __future__ import annotations

import time

import numpy as np

from ..routing.cost import CostModel, MethodConfig
from ..routing.registry import ITEM_POLICIES, routing_policy
from ..routing.views import ClusterView, RoutingRequest
from ..routing.vidur_fit import builtin_profile
from ..sim.engine import SimConfig, simulate
from ..sim.experiments import shape_of
from ..sim.placement import build_locality
from ..sim.workload import SyntheticSpec, poisson_arrivals_ms, synthetic_workload


def bench_simulator(num_requests: int, num_instances: int, seed: int = 0) -> dict[str, float]:
    """Wall time of one rcllm simulation (affinity routing) of `num_requests` requests."""
    w = synthetic_workload(SyntheticSpec(num_requests=num_requests, seed=seed))
    profile = builtin_profile("qwen3-8b@a100")
    loc = build_locality(w, num_instances, "community")
    arrivals = poisson_arrivals_ms(np.random.default_rng(seed), num_requests,
                                   3.5 * num_instances)
    t0 = time.perf_counter()
    simulate(w, arrivals, loc, profile, SimConfig(MethodConfig("rcllm"), seed=seed))
    wall_s = time.perf_counter() - t0
    return {"requests": num_requests, "instances": num_instances, "wall_s": wall_s,
            "requests_per_s": num_requests / wall_s}


def bench_routing(num_instances: int = 100, repeats: int = 2000,
                  seed: int = 0) -> dict[str, float]:
    """Mean µs per `choose` of each policy at `num_instances` instances, 20 candidates."""
    w = synthetic_workload(SyntheticSpec(num_requests=repeats, seed=seed))
    profile = builtin_profile("qwen3-8b@a100")
    cost = CostModel(profile, MethodConfig("rcllm"))
    view = ClusterView(build_locality(w, num_instances, "community"), profile)
    rng = np.random.default_rng(seed)
    view.outstanding_ms[:] = rng.uniform(0, 500, num_instances)
    reqs = [RoutingRequest(shape_of(w, i, int(w.history_tokens[i] * 0.9)), w.candidates[i],
                           w.item_tokens[w.candidates[i]]) for i in range(repeats)]
    out = {}
    for name in ITEM_POLICIES:
        policy = routing_policy(name, cost)
        t0 = time.perf_counter()
        for req in reqs:
            policy.choose(req, view)
        out[f"{name}_us"] = (time.perf_counter() - t0) / repeats * 1e6
    return out
