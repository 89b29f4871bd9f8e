"""Baseline schedules and overlap distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rcllm.checkpoints.baselines import BASELINES, balanced, block, logarithmic, sqrt_spacing
from rcllm.checkpoints.distributions import (
    WORKLOADS, overlap_histogram, sample_depths, total_variation, workload)
from rcllm.checkpoints.planner import expected_recompute, plan_optimal
from rcllm.errors import RcllmError


@pytest.mark.parametrize("name", list(BASELINES))
@pytest.mark.parametrize("n,m", [(1, 1), (10, 3), (100, 32), (8192, 1), (8192, 32), (5, 50)])
def test_baselines_are_valid_schedules(name, n, m):
    pos = BASELINES[name](n, m)
    assert len(pos) <= m
    assert list(pos) == sorted(set(pos))
    assert all(1 <= c <= n for c in pos)


def test_baseline_shapes():
    assert balanced(9, 1) == (5,)
    assert balanced(11, 2) == (4, 8)
    assert block(1000, 3, block_tokens=100) == (100, 200, 300)
    assert block(250, 5, block_tokens=100) == (100, 200)
    assert sqrt_spacing(100, 3) == (10, 20, 30)
    assert logarithmic(1024, 10)[-1] == 1024
    assert logarithmic(1024, 10)[:3] == (2, 4, 8)
    with pytest.raises(RcllmError):
        balanced(10, 0)
    with pytest.raises(RcllmError):
        block(10, 2, block_tokens=0)


def test_histogram_counts_and_exponential_weights():
    h = overlap_histogram([1, 1, 3], 4)
    assert h.tolist() == pytest.approx([0, 2 / 3, 0, 1 / 3, 0])
    w = overlap_histogram([1, 3], 4, half_life=1.0)  # newest weighs 1, the one before 1/2
    assert w[3] == pytest.approx(2 / 3) and w[1] == pytest.approx(1 / 3)
    for bad in ([], [5], [-1]):
        with pytest.raises(RcllmError):
            overlap_histogram(bad, 4)
    with pytest.raises(RcllmError):
        overlap_histogram([1], 4, half_life=0)


def test_exponential_weighting_tracks_drift_better():
    """After the workload shifts, the weighted histogram is closer to the new one, and so is its plan."""
    rng = np.random.default_rng(7)
    n = 2000
    old, new = workload("system_prompt", n), workload("long_doc", n)
    depths = np.concatenate([sample_depths(old, 3000, rng), sample_depths(new, 500, rng)])
    plain = overlap_histogram(depths, n)
    weighted = overlap_histogram(depths, n, half_life=150)
    assert total_variation(weighted, new) < total_variation(plain, new)
    cost = {name: expected_recompute(plan_optimal(hist, n, 4).positions, new, n)
            for name, hist in (("plain", plain), ("weighted", weighted))}
    assert cost["weighted"] < cost["plain"]


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_distributions_with_the_described_shape(name):
    n = 4096
    p = workload(name, n)
    assert p.shape == (n + 1,) and p.sum() == pytest.approx(1.0) and (p >= 0).all()
    mean = float(p @ np.arange(n + 1)) / n
    expected = {"long_doc": (0.75, 1.0), "system_prompt": (0.05, 0.2),
                "multimodal": (0.5, 0.7), "uniform": (0.49, 0.51)}[name]
    assert expected[0] <= mean <= expected[1]
    with pytest.raises(RcllmError):
        workload("nope", n)


def test_sampling_is_seeded():
    p = workload("multimodal", 100)
    a = sample_depths(p, 50, np.random.default_rng(1))
    b = sample_depths(p, 50, np.random.default_rng(1))
    assert (a == b).all() and a.min() >= 0 and a.max() <= 100
    assert math.isclose(p.sum(), 1.0)
