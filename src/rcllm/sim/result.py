"""Per-request outcome of a simulation, its summary statistics and its invariants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class SimResult:
    """Arrays indexed by request. Filled by the engine through the record_* methods.

    ttft_ms = finish_ms − arrival_ms (a request leaves the system at its first token).
    `area_in_system_ms` is ∫ N(t) dt integrated from the event loop's own counter, so Little's
    law (mean N = λ · mean TTFT) is a real check of the bookkeeping, not an identity.
    """

    workload: str
    num_instances: int
    instance: np.ndarray
    item_hit_rate: np.ndarray
    arrival_ms: np.ndarray
    start_ms: np.ndarray
    finish_ms: np.ndarray
    finish_count: np.ndarray
    service_ms: np.ndarray
    computed_tokens: np.ndarray
    area_in_system_ms: float = 0.0
    end_ms: float = 0.0

    @classmethod
    def empty(cls, n: int, k: int, workload: str) -> "SimResult":
        nan = np.full(n, np.nan)
        return cls(workload, k, np.full(n, -1, np.int64), nan.copy(), nan.copy(), nan.copy(),
                   nan.copy(), np.zeros(n, np.int64), nan.copy(), nan.copy())

    def record_route(self, i: int, instance: int, hit_rate: float, now_ms: float) -> None:
        self.instance[i] = instance
        self.item_hit_rate[i] = hit_rate
        self.arrival_ms[i] = now_ms

    def record_finish(self, requests: Sequence[int], instance: int, now_ms: float) -> None:
        self.finish_ms[requests] = now_ms
        self.finish_count[requests] += 1

    def finish(self, start_ms: np.ndarray, service_ms: np.ndarray, computed: np.ndarray,
               area_ms: float, end_ms: float) -> None:
        self.start_ms, self.service_ms, self.computed_tokens = start_ms, service_ms, computed
        self.area_in_system_ms, self.end_ms = area_ms, end_ms

    @property
    def ttft_ms(self) -> np.ndarray:
        return self.finish_ms - self.arrival_ms

    def summary(self) -> dict[str, float]:
        t = self.ttft_ms
        load = np.bincount(self.instance, minlength=self.num_instances)
        return {"requests": int(len(t)), "mean_ttft_ms": float(t.mean()),
                "p50_ttft_ms": float(np.percentile(t, 50)),
                "p90_ttft_ms": float(np.percentile(t, 90)),
                "p99_ttft_ms": float(np.percentile(t, 99)),
                "mean_service_ms": float(self.service_ms.mean()),
                "mean_item_hit_rate": float(self.item_hit_rate.mean()),
                "mean_computed_tokens": float(self.computed_tokens.mean()),
                "max_instance_share": float(load.max() / max(len(t), 1))}

    def check_invariants(self) -> None:
        """Every request routed, started and finished exactly once, in causal order, and
        served FIFO per instance."""
        assert np.all(self.finish_count == 1), "a request finished zero or several times"
        assert np.all((self.instance >= 0) & (self.instance < self.num_instances))
        assert np.all(self.arrival_ms <= self.start_ms + 1e-9), "started before arrival"
        assert np.all(self.start_ms < self.finish_ms + 1e-9), "finished before start"
        for k in range(self.num_instances):
            mine = np.flatnonzero(self.instance == k)
            by_arrival = mine[np.argsort(self.arrival_ms[mine], kind="stable")]
            assert np.all(np.diff(self.start_ms[by_arrival]) >= -1e-9), f"instance {k} not FIFO"
