"""Per-tier operation latency: fixed-bucket histograms that add across processes.

Every tier (memory, disk, Redis) and the store's front keep a `TierLatency` of their `get` and
`put` calls (a Redis call that fails is timed too: a timeout shows as a slow get). Buckets are
fixed and cumulative, so the rows of several Ray instances add up bucket by bucket into one
histogram (`serve.router.RayBackend.store_stats` sums them), which is what Prometheus expects.
`row()` is flat numbers: `<op>_count`, `<op>_sum_s`, `<op>_le_<bound>` (cumulative count).
"""

from __future__ import annotations

import bisect
import functools
import threading
import time

BUCKETS_S = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
OPS = ("get", "put")


def bucket_label(bound_s: float) -> str:
    return f"{bound_s:g}"


class TierLatency:
    """Thread-safe histograms of `get` and `put` durations in seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {op: [0] * (len(BUCKETS_S) + 1) for op in OPS}   # last = over the top
        self._sum_s = {op: 0.0 for op in OPS}

    def observe(self, op: str, seconds: float) -> None:
        i = bisect.bisect_left(BUCKETS_S, seconds)
        with self._lock:
            self._counts[op][i] += 1
            self._sum_s[op] += seconds

    def row(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with self._lock:
            for op in OPS:
                counts = self._counts[op]
                if not sum(counts):
                    continue
                running = 0
                for bound, n in zip(BUCKETS_S, counts):
                    running += n
                    out[f"{op}_le_{bucket_label(bound)}"] = running
                out[f"{op}_count"] = sum(counts)
                out[f"{op}_sum_s"] = self._sum_s[op]
        return out


def timed(op: str):
    """Method decorator: times the call into `self.latency` (a TierLatency) under `op`."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(self, *args, **kwargs)
            finally:
                self.latency.observe(op, time.perf_counter() - t0)

        return inner

    return wrap
