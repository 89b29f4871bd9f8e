"""Ranking and fidelity metrics (numpy/scipy only).

Conventions:
- A score vector has one score per candidate; higher is better.
- The target's rank is 1 + the number of *other* candidates scoring >= the target: ties count
  against the target, so a scorer that cannot tell candidates apart (constant scores) earns
  no credit rather than a lucky first place.
- HR@K = 1[rank <= K]; NDCG@K = 1/log2(rank + 1) if rank <= K else 0 (one relevant item, so
  the ideal DCG is 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import special, stats

ArrayLike = Sequence[float] | np.ndarray


def _vector(scores: ArrayLike, name: str = "scores") -> np.ndarray:
    s = np.asarray(scores, dtype=float)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D vector, got shape {s.shape}")
    if np.isnan(s).any():
        raise ValueError(f"{name} contain NaN")
    return s


def target_rank(scores: ArrayLike, target_index: int) -> int:
    """1-based rank of the target; ties are broken against the target."""
    s = _vector(scores)
    if not 0 <= target_index < s.size:
        raise ValueError(f"target_index {target_index} out of range for {s.size} candidates")
    return int(np.count_nonzero(s >= s[target_index]))  # counts the target itself once


def hit_rate(scores: ArrayLike, target_index: int, k: int) -> float:
    """HR@k: 1.0 if the target ranks in the top k, else 0.0."""
    return float(target_rank(scores, target_index) <= k)


def ndcg(scores: ArrayLike, target_index: int, k: int) -> float:
    """NDCG@k for one relevant item: 1/log2(rank + 1) if rank <= k, else 0.0."""
    rank = target_rank(scores, target_index)
    return float(1.0 / np.log2(rank + 1)) if rank <= k else 0.0


def ranking_metrics(scores: ArrayLike, target_index: int, ks: Sequence[int] = (1, 5, 10)
                    ) -> dict[str, float]:
    """{"hr@k": ..., "ndcg@k": ...} for every k in ks."""
    rank = target_rank(scores, target_index)
    out: dict[str, float] = {}
    for k in ks:
        out[f"hr@{k}"] = float(rank <= k)
        out[f"ndcg@{k}"] = float(1.0 / np.log2(rank + 1)) if rank <= k else 0.0
    return out


@dataclass(frozen=True)
class Interval:
    """A mean with a bootstrap confidence interval [low, high]."""

    mean: float
    low: float
    high: float


def bootstrap_ci(values: ArrayLike, n_resamples: int = 2000, confidence: float = 0.95,
                 seed: int = 0) -> Interval:
    """Percentile-bootstrap CI of the mean of `values` (resampling items with replacement).

    Deterministic for a given seed. A single value gives a zero-width interval.
    """
    v = _vector(values, "values")
    if not 0 < confidence < 1 or n_resamples < 1:
        raise ValueError("need 0 < confidence < 1 and n_resamples >= 1")
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    chunk = max(1, 2_000_000 // v.size)  # bound memory: at most ~2M indices at a time
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        idx = rng.integers(0, v.size, size=(stop - start, v.size))
        means[start:stop] = v[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return Interval(float(v.mean()), float(low), float(high))


def paired_bootstrap_ci(a: ArrayLike, b: ArrayLike, n_resamples: int = 2000,
                        confidence: float = 0.95, seed: int = 0) -> Interval:
    """Bootstrap CI of mean(a - b) over paired observations (the same requests)."""
    va, vb = _vector(a, "a"), _vector(b, "b")
    if va.shape != vb.shape:
        raise ValueError(f"paired samples differ in length: {va.size} vs {vb.size}")
    return bootstrap_ci(va - vb, n_resamples, confidence, seed)


def cluster_bootstrap_ci(values: ArrayLike, groups: Sequence, n_resamples: int = 2000,
                         confidence: float = 0.95, seed: int = 0) -> Interval:
    """Bootstrap CI of the mean of `values` resampling whole groups (e.g. every request of one
    user together), for values correlated within a group; the mean is over the values."""
    v = _vector(values, "values")
    if len(groups) != v.size:
        raise ValueError(f"{len(groups)} groups for {v.size} values")
    if not 0 < confidence < 1 or n_resamples < 1:
        raise ValueError("need 0 < confidence < 1 and n_resamples >= 1")
    _, which = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    sums = np.bincount(which, weights=v)
    counts = np.bincount(which).astype(float)
    idx = np.random.default_rng(seed).integers(0, sums.size, size=(n_resamples, sums.size))
    means = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return Interval(float(v.mean()), float(low), float(high))


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores; ties go to the lower index (stable sort)."""
    return np.argsort(-scores, kind="stable")[:k]


def top1_agreement(a: ArrayLike, b: ArrayLike) -> bool:
    """Whether both score vectors put the same candidate first (ties: lowest index)."""
    va, vb = _vector(a, "a"), _vector(b, "b")
    _same_length(va, vb)
    return bool(_top(va, 1)[0] == _top(vb, 1)[0])


def topk_overlap(a: ArrayLike, b: ArrayLike, k: int) -> float:
    """|top-k(a) ∩ top-k(b)| / k, with k capped at the number of candidates."""
    va, vb = _vector(a, "a"), _vector(b, "b")
    _same_length(va, vb)
    k = min(k, va.size)
    return len(set(_top(va, k).tolist()) & set(_top(vb, k).tolist())) / k


def kendall_tau(a: ArrayLike, b: ArrayLike) -> float:
    """Kendall's tau-b between two score vectors; NaN if either is constant."""
    va, vb = _vector(a, "a"), _vector(b, "b")
    _same_length(va, vb)
    if va.size < 2 or np.all(va == va[0]) or np.all(vb == vb[0]):
        return float("nan")
    return float(stats.kendalltau(va, vb).statistic)


def _same_length(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise ValueError(f"score vectors differ in length: {a.size} vs {b.size}")


def kl_from_logits(p_logits: ArrayLike, q_logits: ArrayLike) -> np.ndarray | float:
    """KL(P || Q) in nats, P = softmax(p_logits), Q = softmax(q_logits), over the last axis.

    Computed from log-softmax (logsumexp), so large logits do not overflow. -inf logits mean
    probability 0: a term with p = 0 contributes 0; p > 0 where q = 0 gives inf.
    Returns a float for 1-D inputs, else an array over the leading axes.
    """
    p = np.asarray(p_logits, dtype=float)
    q = np.asarray(q_logits, dtype=float)
    if p.shape != q.shape:
        raise ValueError(f"logit shapes differ: {p.shape} vs {q.shape}")
    log_p = p - special.logsumexp(p, axis=-1, keepdims=True)
    log_q = q - special.logsumexp(q, axis=-1, keepdims=True)
    prob_p = np.exp(log_p)
    with np.errstate(invalid="ignore"):
        terms = np.where(prob_p > 0, prob_p * (log_p - log_q), 0.0)
    out = terms.sum(axis=-1)
    return float(out) if out.ndim == 0 else out


def kl_from_probs(p: ArrayLike, q: ArrayLike) -> np.ndarray | float:
    """KL(P || Q) in nats from probability vectors (each renormalised to sum 1 on the last axis).

    Uses scipy's rel_entr: 0·log(0/q) = 0, and p > 0 where q = 0 gives inf.
    """
    pa = np.asarray(p, dtype=float)
    qa = np.asarray(q, dtype=float)
    if pa.shape != qa.shape:
        raise ValueError(f"distribution shapes differ: {pa.shape} vs {qa.shape}")
    if (pa < 0).any() or (qa < 0).any():
        raise ValueError("probabilities must be non-negative")
    pa = pa / pa.sum(axis=-1, keepdims=True)
    qa = qa / qa.sum(axis=-1, keepdims=True)
    out = special.rel_entr(pa, qa).sum(axis=-1)
    return float(out) if out.ndim == 0 else out
