"""Distribution-blind checkpoint placements the paper compares the DP against.

Each function returns sorted distinct positions in 1..n, at most m of them. They ignore the
overlap distribution, which is exactly why the DP can beat them on skewed workloads.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from ..errors import RcllmError
from .planner import _check_budget


def _check(n: int, m: int) -> int:
    if int(n) != n or n < 1:
        raise RcllmError(f"prefix length N must be an integer >= 1, got {n!r}")
    return _check_budget(m)


def _clean(positions: np.ndarray, n: int) -> tuple[int, ...]:
    pos = np.unique(np.clip(positions.astype(np.int64), 1, n))
    return tuple(int(c) for c in pos)


def balanced(n: int, m: int) -> tuple[int, ...]:
    """Even spacing: depths 0..n split into m + 1 runs whose lengths differ by at most one.

    This is optimal for the uniform distribution and for the worst case (Theorem 1).
    """
    m = _check(n, m)
    if m >= n:
        return tuple(range(1, n + 1))
    i = np.arange(1, m + 1)
    return _clean((i * (n + 1)) // (m + 1), n)


def block(n: int, m: int, block_tokens: int = 256) -> tuple[int, ...]:
    """A checkpoint every `block_tokens` tokens from the start, the first m of them kept.

    This is what a block-aligned prefix cache does: it fills slots in prefix order.
    """
    m = _check(n, m)
    if block_tokens < 1:
        raise RcllmError("block_tokens must be >= 1")
    count = min(m, n // block_tokens)
    return _clean(np.arange(1, count + 1) * block_tokens, n)


def logarithmic(n: int, m: int) -> tuple[int, ...]:
    """Geometric spacing c_i = round(n^(i/m)), i = 1..m: dense near the start, one at n.

    Rounding can merge the first few positions, so fewer than m may be returned.
    """
    m = _check(n, m)
    i = np.arange(1, m + 1)
    return _clean(np.rint(np.power(float(n), i / m)), n)


def sqrt_spacing(n: int, m: int) -> tuple[int, ...]:
    """A checkpoint every ceil(sqrt(n)) tokens (the classic √L schedule), the first m kept."""
    m = _check(n, m)
    return block(n, m, block_tokens=max(1, math.ceil(math.sqrt(n))))


# Read-only: a registry, not state.
BASELINES: Mapping[str, Callable[[int, int], tuple[int, ...]]] = MappingProxyType({
    "balanced": balanced,
    "block": block,
    "log": logarithmic,
    "sqrt": sqrt_spacing,
})
