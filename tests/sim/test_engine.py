"""Simulator conservation, FIFO, Little's law, an M/D/1 check and batching."""

import numpy as np
import pytest

from rcllm.routing import MethodConfig
from rcllm.routing.vidur_fit import builtin_profile
from rcllm.sim import (SimConfig, SyntheticSpec, Workload, build_locality, poisson_arrivals_ms,
                       simulate, synthetic_workload)

PROFILE = builtin_profile("qwen3-8b@a100")


@pytest.fixture(scope="module")
def workload():
    return synthetic_workload(SyntheticSpec(num_items=5000, num_requests=3000,
                                            num_communities=40, placement_requests=3000))


def _run(w, k, method, qps, policy="auto", profile=PROFILE, seed=0):
    loc = build_locality(w, k, "community" if w.community is not None else "hash")
    arr = poisson_arrivals_ms(np.random.default_rng(seed), w.num_requests, qps)
    return simulate(w, arr, loc, profile, SimConfig(MethodConfig(method), policy=policy,
                                                    seed=seed))


@pytest.mark.parametrize("method", ["full", "prefix", "rcllm"])
def test_every_request_finishes_once_fifo(workload, method):
    res = _run(workload, 8, method, qps=30.0)
    res.check_invariants()
    assert np.all(res.ttft_ms >= res.service_ms - 1e-6)   # a batch lasts >= each member


def test_littles_law(workload):
    res = _run(workload, 8, "rcllm", qps=60.0)
    mean_in_system = res.area_in_system_ms / res.end_ms
    lam_per_ms = workload.num_requests / res.end_ms
    assert mean_in_system == pytest.approx(lam_per_ms * res.ttft_ms.mean(), rel=1e-6)
    assert mean_in_system > 1.0   # there was real concurrency to account for


def _constant_workload(n, tokens=1000):
    return Workload("const", item_tokens=np.full(10, 50), candidates=np.zeros((n, 20), np.int64),
                    history_reviews=np.zeros(n, np.int64), history_tokens=np.zeros(n, np.int64),
                    prefix_tokens=0, fresh_tokens=tokens - 1000, placement_requests=np.zeros(
                        (1, 20), np.int64))


def test_single_instance_matches_md1_queue():
    """Poisson arrivals, one server, deterministic service, no batching: Pollaczek–Khinchine
    gives mean wait = rho·S / (2(1 − rho))."""
    w = _constant_workload(20000)
    prof = PROFILE.replace(max_batch_tokens=1)
    service_ms = prof.full_prefill_ms(w.context_tokens()[0])
    rho = 0.6
    res = _run(w, 1, "full", qps=rho * 1000 / service_ms, profile=prof)
    res.check_invariants()
    wait = res.ttft_ms.mean() - service_ms
    assert wait == pytest.approx(rho * service_ms / (2 * (1 - rho)), rel=0.1)


def test_burst_is_batched_and_finishes_together():
    w = _constant_workload(4)
    prof = PROFILE.replace(max_batch_tokens=2000)
    loc = build_locality(w, 1, "hash")
    arr = np.array([1.0, 2.0, 3.0, 4.0])
    res = simulate(w, arr, loc, prof, SimConfig(MethodConfig("full")))
    res.check_invariants()
    one = prof.full_prefill_ms(1000)
    # request 0 runs alone; 1 and 2 share a batch (2000 tokens); 3 runs after them
    assert res.finish_ms[0] == pytest.approx(1.0 + one)
    assert res.finish_ms[1] == res.finish_ms[2] == pytest.approx(1.0 + one + 2 * one
                                                                 - prof.fixed_ms)
    assert res.finish_ms[3] > res.finish_ms[2]


def test_deterministic_for_a_seed(workload):
    a = _run(workload, 4, "rcllm", 20.0, seed=3).ttft_ms
    b = _run(workload, 4, "rcllm", 20.0, seed=3).ttft_ms
    assert np.array_equal(a, b)


def test_policies_pile_balance_and_sit_between(workload):
    """Hit-Only piles onto the instances holding the items, Load-Only spreads, affinity is
    in between; with hits, rcllm beats prefix."""
    hot = Workload(**{**workload.__dict__, "candidates": workload.candidates % 40 * 8})
    share = {p: _run(hot, 8, "rcllm", 40.0, policy=p).summary()["max_instance_share"]
             for p in ("hit-only", "affinity", "load-only")}
    assert share["hit-only"] > 0.9
    assert share["load-only"] < 0.3   # ~1/8 of requests, more where hits make them cheaper
    assert share["load-only"] < share["affinity"] < share["hit-only"]
    mean = {p: _run(workload, 8, m, 30.0, policy=p).summary()["mean_ttft_ms"]
            for m, p in (("prefix", "load-only"), ("rcllm", "affinity"))}
    assert mean["affinity"] < mean["load-only"]


def test_auto_routes_each_method_by_its_own_policy_prefix_by_load():
    """"auto" reads the registry's method policy; prefix's (prefix-aware) needs a prefix
    picture the simulator's views do not carry, so it goes by load, as it always has."""
    from rcllm.routing.registry import ITEM_POLICIES, method_policy

    auto = {m: SimConfig(MethodConfig(m)).policy_name() for m in ("full", "prefix", "rcllm")}
    assert auto == {"full": "load-only", "prefix": "load-only", "rcllm": "affinity"}
    assert method_policy("prefix") not in ITEM_POLICIES
    assert SimConfig(MethodConfig("rcllm"), policy="hit-only").policy_name() == "hit-only"
