"""The paper's theory, checked numerically: Theorem 1 (balanced) and the Lipschitz bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rcllm.checkpoints.baselines import balanced
from rcllm.checkpoints.distributions import total_variation
from rcllm.checkpoints.planner import expected_recompute, plan_optimal, recompute_per_depth


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 40))
def test_balanced_is_optimal_for_uniform(n, m):
    p = np.ones(n + 1)
    assert expected_recompute(balanced(n, m), p, n) == pytest.approx(
        plan_optimal(p, n, m).expected_recompute, rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 2000), st.integers(1, 30))
def test_balanced_minimises_the_worst_case(n, m):
    """No schedule of m checkpoints has a smaller maximum recompute than balanced spacing."""
    worst = int(recompute_per_depth(balanced(n, m), n).max())
    lower_bound = -(-(n + 1) // (m + 1)) - 1  # some run of depths has length >= ceil((n+1)/(m+1))
    assert worst == max(lower_bound, 0)


def _pair(seed: int, n: int):
    rng = np.random.default_rng(seed)
    p = rng.random(n + 1) ** 3
    q = p * np.exp(rng.normal(0, rng.uniform(0.01, 2.0), n + 1))
    return p / p.sum(), q / q.sum()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(5, 500), st.integers(1, 16))
def test_value_is_lipschitz_in_the_distribution(seed, n, m):
    """|V(p) − V(q)| <= TV(p, q) · n, and a fixed schedule moves by at most TV · max_t r(t)."""
    p, q = _pair(seed, n)
    tv = total_variation(p, q)
    vp, vq = plan_optimal(p, n, m), plan_optimal(q, n, m)
    assert abs(vp.expected_recompute - vq.expected_recompute) <= tv * n + 1e-9
    for sched in (vp.positions, vq.positions, balanced(n, m)):
        gap = int(recompute_per_depth(sched, n).max())
        moved = abs(expected_recompute(sched, p, n) - expected_recompute(sched, q, n))
        assert moved <= tv * gap + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(5, 500), st.integers(1, 16))
def test_planning_on_the_wrong_distribution_costs_at_most_tv_times_gaps(seed, n, m):
    """E_p[r(C_q)] − V(p) <= TV(p, q) · (G(C_p) + G(C_q)) <= 2 · TV · n (Theorem 3's shape)."""
    p, q = _pair(seed, n)
    tv = total_variation(p, q)
    cp, cq = plan_optimal(p, n, m).positions, plan_optimal(q, n, m).positions
    regret = expected_recompute(cq, p, n) - expected_recompute(cp, p, n)
    gaps = recompute_per_depth(cp, n).max() + recompute_per_depth(cq, n).max()
    assert -1e-9 <= regret <= tv * gaps + 1e-9
    assert regret <= 2 * tv * n + 1e-9
