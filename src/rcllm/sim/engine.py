"""The discrete-event cluster simulator: a heap event loop over K instances.

Events are (time_ms, seq, kind, payload) on one heap: ARRIVAL of request i (the next arrival is
pushed when one is handled, so the heap stays at K + 1 entries) and DONE of instance k's batch.
On arrival the routing policy reads the `ClusterView` (outstanding work refreshed to the event
time) and the request joins instance k's FIFO queue with its service time from the cost model.
An idle instance starts a batch: queued requests in FIFO order while their computed tokens fit
`max_batch_tokens` (always at least one); a batch costs one fixed overhead plus each request's
variable part, and every request in it gets its first token when the batch ends.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..routing.cost import CostModel, MethodConfig, RequestShape
from ..routing.policies import LoadOnly
from ..routing.registry import ITEM_POLICIES, method_policy, routing_policy
from ..routing.profiles import SpeedProfile
from ..routing.views import ArrayLocality, ClusterView, RoutingRequest
from .result import SimResult
from .workload import Workload

ARRIVAL, DONE = 0, 1


@dataclass(frozen=True)
class SimConfig:
    """One simulation run. policy "auto": the method's own (`registry.method_policy`), by load
    where that one reads what the simulator's views lack (prefix: prefix-aware)."""

    method: MethodConfig = MethodConfig()
    policy: str = "auto"
    w_hit: float = 1.0
    w_idle: float | None = 4.0   # chosen by the sweep in docs/simulator.md; None: derived
    history_hit_rate: float = 0.93   # share of reviews with a near-1 prototype match
    seed: int = 0

    def policy_name(self) -> str:
        if self.policy != "auto":
            return self.policy
        own = method_policy(self.method.method)
        # the views carry item KV and load, no prefix picture (yet): prefix goes by load
        return own if own in ITEM_POLICIES else LoadOnly.name


def history_hits(rng: np.random.Generator, workload: Workload, hit_rate: float) -> np.ndarray:
    """History tokens per request whose review matched a prototype (binomial over reviews)."""
    reviews = np.maximum(workload.history_reviews, 1)
    hits = rng.binomial(workload.history_reviews, hit_rate)
    return np.rint(workload.history_tokens * hits / reviews).astype(np.int64)


class _Cluster:
    """Queues and busy state of K instances; updates the shared ClusterView arrays."""

    def __init__(self, view: ClusterView, max_batch_tokens: int, n: int) -> None:
        k = view.num_instances
        self.view = view
        self.max_batch_tokens = max_batch_tokens
        self.queues: list[deque[int]] = [deque() for _ in range(k)]
        self.busy_until = np.zeros(k)
        self.queued_ms = np.zeros(k)
        self.running: list[list[int]] = [[] for _ in range(k)]
        self.service_ms = np.zeros(n)
        self.computed = np.zeros(n)
        self.start_ms = np.full(n, np.nan)

    def refresh(self, now_ms: float) -> None:
        np.maximum(self.busy_until - now_ms, 0.0, out=self.view.outstanding_ms)
        self.view.outstanding_ms += self.queued_ms

    def enqueue(self, k: int, i: int) -> None:
        self.queues[k].append(i)
        self.queued_ms[k] += self.service_ms[i]
        self.view.queue_depth[k] += 1

    def start_batch(self, k: int, now_ms: float, fixed_ms: float) -> float:
        """Starts instance k's next batch; returns its end time."""
        queue, batch = self.queues[k], []
        tokens = 0.0
        while queue and (not batch or tokens + self.computed[queue[0]] <= self.max_batch_tokens):
            i = queue.popleft()
            tokens += self.computed[i]
            batch.append(i)
        services = self.service_ms[batch]
        self.queued_ms[k] = max(self.queued_ms[k] - services.sum(), 0.0) if queue else 0.0
        self.start_ms[batch] = now_ms
        end = now_ms + fixed_ms + float((services - fixed_ms).sum())
        self.busy_until[k] = end
        self.running[k] = batch
        return end


def simulate(workload: Workload, arrivals_ms: np.ndarray, locality: ArrayLocality,
             profile: SpeedProfile, cfg: SimConfig) -> SimResult:
    """Runs every request of `workload` to its first token; returns per-request times."""
    n, k = workload.num_requests, locality.num_instances
    rng = np.random.default_rng(cfg.seed)
    hist_hit = history_hits(rng, workload, cfg.history_hit_rate)
    cost = CostModel(profile, cfg.method)
    view = ClusterView(locality, profile)
    policy = routing_policy(cfg.policy_name(), cost, cfg.w_hit, cfg.w_idle)
    cluster = _Cluster(view, profile.max_batch_tokens, n)
    res = SimResult.empty(n, k, workload.name)
    tokens_of = workload.item_tokens
    heap: list[tuple[float, int, int, int]] = [(float(arrivals_ms[0]), 0, ARRIVAL, 0)]
    seq, in_system, last_t, area = 1, 0, 0.0, 0.0
    while heap:
        t, _, kind, x = heapq.heappop(heap)
        area += in_system * (t - last_t)
        last_t = t
        if kind == ARRIVAL:
            if x + 1 < n:
                heapq.heappush(heap, (float(arrivals_ms[x + 1]), seq, ARRIVAL, x + 1))
                seq += 1
            items = workload.candidates[x]
            item_tokens = tokens_of[items]
            shape = RequestShape(workload.prefix_tokens, workload.fresh_tokens,
                                 int(workload.history_tokens[x]), int(hist_hit[x]),
                                 int(item_tokens.sum()))
            cluster.refresh(t)
            dest = policy.choose(RoutingRequest(shape, items, item_tokens), view)
            hot = locality.is_hot[items] | (locality.shard[items] == dest)
            local = float(item_tokens[hot].sum())
            work = cost.work(shape, local)
            cluster.service_ms[x] = float(cost.service_ms(work))
            cluster.computed[x] = float(work.computed_tokens)
            res.record_route(x, dest, local / max(shape.item_tokens, 1), t)
            cluster.enqueue(dest, x)
            in_system += 1
            k_dest = dest
        else:
            k_dest = x
            done = cluster.running[x]
            res.record_finish(done, x, t)
            in_system -= len(done)
            view.queue_depth[x] -= len(done)
            cluster.running[x] = []
        if not cluster.running[k_dest] and cluster.queues[k_dest]:
            end = cluster.start_batch(k_dest, t, profile.fixed_ms)
            heapq.heappush(heap, (end, seq, DONE, k_dest))
            seq += 1
    res.finish(cluster.start_ms, cluster.service_ms, cluster.computed, area, last_t)
    return res
