"""Overlap-depth distributions: empirical histograms of past requests and synthetic workloads.

A distribution over depths 0..N is a float64 array of length N + 1. The synthetic workloads
mimic the paper's: long-document Q&A (overlap concentrated near the full prefix), system
prompts (a few short shared prompts), a broad multi-modal workload, and uniform.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import RcllmError

WORKLOADS = ("long_doc", "system_prompt", "multimodal", "uniform")


def overlap_histogram(depths: Sequence[int] | np.ndarray, n: int,
                      half_life: float | None = None) -> np.ndarray:
    """A normalised histogram of observed overlap depths (oldest first).

    half_life: if given, observation i of k gets weight 0.5 ** ((k − 1 − i) / half_life), so
    the newest request weighs 1 and one `half_life` requests older weighs 1/2: the exponentially
    weighted estimate the paper uses under drift. Raises RcllmError for no depths, a depth
    outside 0..n, or half_life <= 0.
    """
    if int(n) != n or n < 1:
        raise RcllmError(f"prefix length N must be an integer >= 1, got {n!r}")
    d = np.asarray(depths, dtype=np.int64)
    if d.ndim != 1 or d.size == 0:
        raise RcllmError("need at least one observed overlap depth")
    if d.min() < 0 or d.max() > n:
        raise RcllmError(f"overlap depths must lie in 0..{n}")
    if half_life is None:
        weights = np.ones(d.size)
    else:
        if not half_life > 0:
            raise RcllmError("half_life must be > 0")
        age = np.arange(d.size - 1, -1, -1, dtype=np.float64)
        weights = np.power(0.5, age / half_life)
    hist = np.bincount(d, weights=weights, minlength=n + 1)
    return hist / hist.sum()


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """TV(p, q) = ½ Σ |p_t − q_t| for two normalised distributions of the same length."""
    if p.shape != q.shape:
        raise RcllmError(f"distributions differ in length: {p.shape} vs {q.shape}")
    return 0.5 * float(np.abs(p - q).sum())


def _bump(n: int, centre: float, width: float) -> np.ndarray:
    t = np.arange(n + 1, dtype=np.float64)
    b = np.exp(-0.5 * ((t - centre) / max(width, 1e-9)) ** 2)
    return b / b.sum() if b.sum() > 0 else np.full(n + 1, 1.0 / (n + 1))


def workload(name: str, n: int) -> np.ndarray:
    """The depth distribution of a named synthetic workload on a prefix of n tokens.

    long_doc: 75% within a few % of the full length (many questions on one document), 25%
    uniform. system_prompt: three shared system prompts of 4%, 9% and 15% of the prefix
    (weights .5/.3/.15) plus a 5% uniform tail. multimodal: modes at 30/60/90% (NarrativeQA-like
    spread). uniform: every depth 0..n equally likely.
    """
    if int(n) != n or n < 1:
        raise RcllmError(f"prefix length N must be an integer >= 1, got {n!r}")
    uni = np.full(n + 1, 1.0 / (n + 1))
    if name == "uniform":
        p = uni
    elif name == "long_doc":
        p = 0.75 * _bump(n, n, 0.04 * n) + 0.25 * uni  # a half-normal ending at n
    elif name == "system_prompt":
        p = 0.05 * uni
        for frac, weight in ((0.04, 0.5), (0.09, 0.3), (0.15, 0.15)):
            p = p + weight * _bump(n, frac * n, 0.005 * n)
    elif name == "multimodal":
        p = sum(_bump(n, frac * n, 0.05 * n) for frac in (0.3, 0.6, 0.9)) / 3.0
    else:
        raise RcllmError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return p / p.sum()


def sample_depths(p: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` i.i.d. depths drawn from the normalised distribution p (int64)."""
    if count < 1:
        raise RcllmError("count must be >= 1")
    return rng.choice(p.size, size=count, p=p).astype(np.int64)
