"""Where to place M recurrent-state checkpoints on a prefix of N tokens (PAPERS.md §3).

Model. A checkpoint at position c stores the recurrent state after the first c tokens; the
state at 0 (the zero state) is always available for free. A future request that shares the
first t tokens of the prefix (its *overlap depth*, 0 <= t <= N) resumes from
ℓ(t; C) = max({0} ∪ {c ∈ C : c <= t}) and recomputes r(t; C) = t − ℓ(t; C) tokens. Given the
depth distribution p_t (an array of length N + 1 indexed by t, any non-negative scale) the
planner minimises E_p[r(T; C)] over sets of at most M positions in 1..N: a one-sided weighted
k-median on a line.

Algorithm. With prefix sums S0[k] = Σ_{t<k} p_t and S1[k] = Σ_{t<k} t·p_t, the cost of serving
depths [s, e) from a checkpoint at s is w(s, e) = (S1[e] − S1[s]) − s·(S0[e] − S0[s]), so each
w is O(1). g_m[s] = min cost of depths [s, N] given a checkpoint at s and at most m more to
its right:

    g_0[s] = w(s, N+1),   g_m[s] = min_{s < e <= N+1} w(s, e) + g_{m−1}[e]   (g[N+1] = 0)

and the answer is g_M[0]. w satisfies the quadrangle (Monge) inequality — for a <= b <= c <= d,
w(a,d) + w(b,c) − w(a,c) − w(b,d) = (b − a)·Σ_{t∈[c,d)} p_t >= 0 — so the leftmost minimiser
e*(s) is non-decreasing in s and each layer is solved by divide and conquer over s. The D&C
is vectorised per recursion level with numpy (all subproblems of one level at once), so a layer
is ~log2(K) numpy passes over O(K) candidates: O(K·M·log K) arithmetic, where K is the number of
support points (only depths with p_t > 0 can be useful checkpoints: moving a checkpoint right
to the next depth with mass never raises the cost). N = 100k, M = 64 (dense p) takes ~1.4–1.9 s
on the shared 2-core dev machine; the O(N·M) bound of the paper needs a sequential
convex-hull sweep, which is slower than this in pure Python.

The planner is pure numpy: it must not import torch (tests check this).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import RcllmError


@dataclass(frozen=True)
class Schedule:
    """A checkpoint placement and its expected recompute under the distribution it was planned for.

    positions: sorted distinct checkpoint positions in 1..N (at most the budget; fewer when
    extra checkpoints cannot help). expected_recompute: E_p[t − ℓ(t)] in tokens, p normalised.
    """

    n: int
    positions: tuple[int, ...]
    expected_recompute: float


def validate_distribution(p: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    """Returns p as float64 normalised to sum 1; raises RcllmError for bad input.

    p must have length n + 1 (depths 0..n), be finite, non-negative, and have positive total.
    """
    if int(n) != n or n < 1:
        raise RcllmError(f"prefix length N must be an integer >= 1, got {n!r}")
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or arr.shape[0] != n + 1:
        raise RcllmError(f"overlap distribution must have length N + 1 = {n + 1} "
                         f"(depths 0..N), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise RcllmError("overlap distribution must be finite and non-negative")
    total = float(arr.sum())
    if not total > 0:
        raise RcllmError("overlap distribution must have a positive total mass")
    return arr / total


def _check_budget(m: int) -> int:
    if int(m) != m or m < 1:
        raise RcllmError(f"checkpoint budget M must be an integer >= 1, got {m!r}")
    return int(m)


def _check_positions(positions: Sequence[int], n: int) -> np.ndarray:
    pos = np.unique(np.asarray(list(positions), dtype=np.int64))
    if pos.size and (pos[0] < 1 or pos[-1] > n):
        raise RcllmError(f"checkpoint positions must lie in 1..{n}")
    return pos


def recompute_per_depth(positions: Sequence[int], n: int) -> np.ndarray:
    """r(t; C) = t − ℓ(t; C) for every depth t = 0..n, as an int64 array of length n + 1."""
    pos = _check_positions(positions, n)
    depths = np.arange(n + 1, dtype=np.int64)
    marks = np.zeros(n + 1, dtype=np.int64)
    marks[pos] = pos
    deepest = np.maximum.accumulate(marks)  # ℓ(t): the largest checkpoint <= t (0 if none)
    return depths - deepest


def expected_recompute(positions: Sequence[int], p: Sequence[float] | np.ndarray, n: int) -> float:
    """E_p[t − ℓ(t; C)] in tokens (p is normalised first)."""
    probs = validate_distribution(p, n)
    return float(probs @ recompute_per_depth(positions, n))


def expected_depth(p: Sequence[float] | np.ndarray, n: int) -> float:
    """E_p[t]: the recurrent work per request with no checkpoint at all."""
    probs = validate_distribution(p, n)
    return float(probs @ np.arange(n + 1))


def _dp_layer(prev: np.ndarray, x: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One DP layer over candidate points x[0..K] (x[K] = N + 1, the 'no more checkpoints' end).

    prev[j] = g_{m−1} at x[j] (prev[K] = 0); s0/s1 are the prefix sums read at x. Returns
    (g_m at x[0..K−1], leftmost argmin index j > i for each i).
    """
    k = x.size - 1
    # w(i, j) + prev[j] = (s1[j] + prev[j] − x[i]·s0[j]) + (x[i]·s0[i] − s1[i]); the second
    # bracket is constant per i, so the argmin only needs the first.
    reach = s1 + prev
    const = x[:k] * s0[:k] - s1[:k]
    g = np.empty(k, dtype=np.float64)
    arg = np.empty(k, dtype=np.int64)
    lo, hi = np.array([0]), np.array([k - 1])
    olo, ohi = np.array([1]), np.array([k])
    while lo.size:
        mid = (lo + hi) // 2
        a = np.maximum(olo, mid + 1)  # the next checkpoint lies strictly right of mid
        cnt = ohi - a + 1
        starts = np.cumsum(cnt) - cnt
        # j (the flat candidate list) as a cumulative sum of steps: +1 inside a subproblem, a
        # jump to its first candidate at each subproblem start. Integers: exact.
        j = np.ones(int(starts[-1] + cnt[-1]), dtype=np.int64)
        j[0] = a[0]
        j[starts[1:]] = a[1:] - (a[:-1] + cnt[:-1] - 1)
        np.cumsum(j, out=j)
        vals = np.repeat(x[mid], cnt)
        vals *= np.take(s0, j)
        np.subtract(np.take(reach, j), vals, out=vals)
        mins = np.minimum.reduceat(vals, starts)
        # leftmost argmin per segment: the smallest flat index whose value equals the segment min
        hits = np.flatnonzero(vals <= np.repeat(mins, cnt))
        best = j[hits[np.searchsorted(hits, starts)]]
        g[mid], arg[mid] = mins + const[mid], best
        left, right = lo <= mid - 1, mid + 1 <= hi
        lo = np.concatenate([lo[left], mid[right] + 1])
        hi = np.concatenate([mid[left] - 1, hi[right]])
        olo = np.concatenate([olo[left], best[right]])
        ohi = np.concatenate([best[left], ohi[right]])
    return g, arg


def plan_optimal(p: Sequence[float] | np.ndarray, n: int, m: int) -> Schedule:
    """The exact minimiser of E_p[t − ℓ(t; C)] over |C| <= m, C ⊆ 1..n (see module docstring).

    Ties are broken towards the leftmost next checkpoint, so the result is deterministic.
    """
    return plan_budgets(p, n, m)[-1]


def plan_budgets(p: Sequence[float] | np.ndarray, n: int, max_m: int) -> list[Schedule]:
    """Optimal schedules for every budget 1..max_m from one DP run (element b − 1 is budget b).

    The DP tables for budget M contain those for every smaller budget, so a sweep costs the
    same as its largest budget.
    """
    probs = validate_distribution(p, n)
    max_m = _check_budget(max_m)
    support = np.flatnonzero(probs[1:] > 0) + 1
    x = np.concatenate([[0], support, [n + 1]]).astype(np.int64)  # candidate checkpoints + end
    s0 = np.concatenate([[0.0], np.cumsum(probs)])
    s1 = np.concatenate([[0.0], np.cumsum(probs * np.arange(n + 1))])
    s0x, s1x, xf = s0[x], s1[x], x.astype(np.float64)
    k = x.size - 1
    # Beyond k − 1 checkpoints every depth with mass has one: nothing is ever recomputed.
    layers = min(max_m, k - 1)
    g = np.zeros(k + 1)
    g[:k] = (s1x[k] - s1x[:k]) - xf[:k] * (s0x[k] - s0x[:k])  # g_0: no further checkpoint
    args: list[np.ndarray] = []
    for _ in range(layers):
        layer, arg = _dp_layer(g, xf, s0x, s1x)
        g = np.append(layer, 0.0)
        args.append(arg)
    out = []
    for budget in range(1, max_m + 1):
        if budget > layers:
            out.append(Schedule(n, tuple(int(c) for c in support), 0.0))
            continue
        positions, i = [], 0
        for arg in reversed(args[:budget]):  # from the free checkpoint at 0: budget b, b − 1, ...
            nxt = int(arg[i])
            if nxt == k:
                break
            positions.append(int(x[nxt]))
            i = nxt
        out.append(Schedule(n, tuple(positions), float(probs @ recompute_per_depth(positions, n))))
    return out


def brute_force(p: Sequence[float] | np.ndarray, n: int, m: int) -> Schedule:
    """Exhaustive search over all subsets of 1..n of size <= m (tests only; tiny n)."""
    from itertools import combinations

    probs = validate_distribution(p, n)
    m = _check_budget(m)
    best: tuple[float, tuple[int, ...]] = (float(probs @ np.arange(n + 1)), ())
    for size in range(1, min(m, n) + 1):
        for combo in combinations(range(1, n + 1), size):
            cost = float(probs @ recompute_per_depth(combo, n))
            if cost < best[0]:
                best = (cost, combo)
    return Schedule(n, best[1], best[0])
