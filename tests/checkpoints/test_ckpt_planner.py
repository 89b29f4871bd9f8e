"""The DP planner: exact against brute force, input validation, cost bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rcllm.checkpoints.planner import (
    brute_force, expected_depth, expected_recompute, plan_budgets, plan_optimal,
    recompute_per_depth)
from rcllm.errors import RcllmError


@st.composite
def small_problem(draw):
    n = draw(st.integers(1, 9))
    weights = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.0, 10.0)),
                            min_size=n + 1, max_size=n + 1))
    if sum(weights) <= 0:
        weights[draw(st.integers(0, n))] = 1.0
    m = draw(st.integers(1, 4))
    return np.array(weights), n, m


@settings(max_examples=300, deadline=None)
@given(small_problem())
def test_dp_matches_brute_force(problem):
    p, n, m = problem
    dp, bf = plan_optimal(p, n, m), brute_force(p, n, m)
    assert dp.expected_recompute == pytest.approx(bf.expected_recompute, rel=1e-9, abs=1e-12)
    assert len(dp.positions) <= m
    assert list(dp.positions) == sorted(set(dp.positions))
    assert all(1 <= c <= n for c in dp.positions)
    # The reported cost is the true cost of the reported positions.
    assert dp.expected_recompute == pytest.approx(expected_recompute(dp.positions, p, n), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(20, 400), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_dp_never_worse_than_any_random_schedule(n, m, seed):
    rng = np.random.default_rng(seed)
    p = rng.random(n + 1) ** 4  # skewed
    best = plan_optimal(p, n, m).expected_recompute
    for _ in range(20):
        pos = rng.choice(np.arange(1, n + 1), size=min(m, n), replace=False)
        assert best <= expected_recompute(pos, p, n) + 1e-9


def test_cost_falls_with_budget_and_reaches_zero():
    rng = np.random.default_rng(3)
    n = 200
    p = rng.random(n + 1) * (rng.random(n + 1) < 0.1)
    costs = [plan_optimal(p, n, m).expected_recompute for m in range(1, 30)]
    assert all(b <= a + 1e-12 for a, b in zip(costs, costs[1:]))
    support = int(np.count_nonzero(p[1:]))
    sched = plan_optimal(p, n, support)
    assert sched.expected_recompute == 0.0
    assert set(sched.positions) == set(np.flatnonzero(p[1:]) + 1)


def test_point_mass_gets_a_checkpoint_exactly_there():
    n = 1000
    p = np.zeros(n + 1)
    p[737] = 1.0
    assert plan_optimal(p, n, 1).positions == (737,)
    assert plan_optimal(p, n, 1).expected_recompute == 0.0


def test_recompute_per_depth_definition():
    r = recompute_per_depth([3, 7], 9)
    assert r.tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]
    assert expected_depth(np.ones(10), 9) == pytest.approx(4.5)


@pytest.mark.parametrize("p,n,m,msg", [
    (np.ones(5), 4, 0, "budget M"),
    (np.ones(5), 0, 1, "prefix length"),
    (np.zeros(5), 4, 1, "positive total"),
    (np.ones(4), 4, 1, "length N \\+ 1"),
    (np.array([1, -1, 1, 1, 1.0]), 4, 1, "non-negative"),
    (np.array([1, np.nan, 1, 1, 1.0]), 4, 1, "finite"),
])
def test_bad_input_raises_rcllm_error(p, n, m, msg):
    with pytest.raises(RcllmError, match=msg):
        plan_optimal(p, n, m)


def test_positions_out_of_range_rejected():
    with pytest.raises(RcllmError):
        expected_recompute([0, 3], np.ones(5), 4)
    with pytest.raises(RcllmError):
        expected_recompute([5], np.ones(5), 4)


@settings(max_examples=40, deadline=None)
@given(small_problem())
def test_budget_sweep_equals_individual_plans(problem):
    p, n, _ = problem
    sweep = plan_budgets(p, n, 5)
    assert [s.expected_recompute for s in sweep] == pytest.approx(
        [brute_force(p, n, m).expected_recompute for m in range(1, 6)], abs=1e-12)
