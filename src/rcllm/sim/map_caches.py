"""The map's simulator (`sim/map.py`): every instance's item store and the requests' FIFO
queues. The store rule is the cache replay's (`served_stores.StoreSim`: least recently used by
bytes, a miss stored once its request runs), vectorised over a 100k-item catalogue; the
queueing is the engine simulator's (`engine.simulate`) with one request per batch, written as
Lindley's recursion because a request's service is known when it is routed. Plain numpy; the
policy objects are the router's (`routing.registry`)."""

from __future__ import annotations

import heapq

import numpy as np

from ..routing.cost import CostModel, RequestShape
from ..routing.registry import routing_policy
from ..routing.views import ArrayLocality, ClusterView, RoutingRequest
from .workload import Workload

EVICT_SHARE = 0.01      # an over-full store drops its oldest 1% at once, in one pass


class ItemCaches:
    """Every instance's item store, least recently used by tokens under one budget (the cache
    replay's `StoreSim` rule, approximate: an over-full store drops its oldest EVICT_SHARE of
    items at once). Also the routers' `Locality`: they see what the stores hold."""

    def __init__(self, held: np.ndarray, last: np.ndarray, tokens: np.ndarray,
                 budget_tokens: float) -> None:
        self.held, self.last, self.tokens = held, last, tokens    # [K, N] bool, [K, N], [N]
        self.budget = float(budget_tokens)
        self.used = (held * tokens).sum(axis=1).astype(float)
        self.num_instances = held.shape[0]
        self.clock = 0
        self.inserted = 0

    @classmethod
    def from_placement(cls, loc: ArrayLocality, popularity: np.ndarray, tokens: np.ndarray,
                       budget_tokens: float) -> "ItemCaches":
        """Instance k holds, while its budget lasts: the hot items, its shard, then the rest,
        each most popular first (the placement's store, topped up with replicas)."""
        k, n = loc.num_instances, len(tokens)
        order = np.lexsort((np.arange(n), -popularity))
        held, last = np.zeros((k, n), bool), np.zeros((k, n), np.int32)
        for i in range(k):
            rank = np.where(loc.is_hot[order], 0, np.where(loc.shard[order] == i, 1, 2))
            pri = order[np.argsort(rank, kind="stable")]
            m = int(np.searchsorted(np.cumsum(tokens[pri]), budget_tokens, side="right"))
            held[i, pri[:m]] = True
            last[i, pri[:m]] = -np.arange(m)          # the most popular the most recent
        return cls(held, last, tokens, budget_tokens)

    @classmethod
    def steady(cls, stream: np.ndarray, tokens: np.ndarray, budget_tokens: float,
               k: int) -> "ItemCaches":
        """K copies of one store fed the whole request stream `stream` ([m, C] items) from
        empty: where a router blind to items leaves every store, each seeing a random share of
        the stream (Che's approximation of LRU)."""
        one = cls(np.zeros((1, len(tokens)), bool), np.zeros((1, len(tokens)), np.int32),
                  tokens, budget_tokens)
        for items in stream:
            one.use(0, items)
        one.last -= one.clock + 1
        return cls(np.repeat(one.held, k, axis=0), np.repeat(one.last, k, axis=0), tokens,
                   budget_tokens)

    def copy(self) -> "ItemCaches":
        return ItemCaches(self.held.copy(), self.last.copy(), self.tokens, self.budget)

    def local_tokens(self, items, item_tokens) -> np.ndarray:
        return self.held[:, items] @ np.asarray(item_tokens, float)

    def use(self, k: int, items: np.ndarray) -> None:
        """A request with `items` ran on k: hits refreshed, misses stored, the oldest dropped."""
        self.clock += 1
        row = self.held[k]
        miss = np.unique(items[~row[items]])
        row[miss] = True
        self.inserted += len(miss)
        self.used[k] += float(self.tokens[miss].sum())
        self.last[k, items] = self.clock
        while self.used[k] > self.budget:
            idx = np.flatnonzero(row)
            m = max(1, int(EVICT_SHARE * len(idx)))
            drop = idx[np.argpartition(self.last[k, idx], m - 1)[:m]]
            row[drop] = False
            self.used[k] -= float(self.tokens[drop].sum())

    def check_invariants(self) -> None:
        assert np.allclose(self.used, (self.held * self.tokens).sum(axis=1)), "tokens drifted"
        assert np.all(self.used <= self.budget + 1e-6), "a store is over its budget"


def serve(w: Workload, arrivals_ms: np.ndarray, caches: ItemCaches, cost: CostModel,
          policy: str, warmup: int, slo_ms: float) -> dict:
    """Requests in arrival order through K FIFO instances (Lindley: start = max(arrival, the
    instance free)), routed by `policy` on the stores' contents and the exact outstanding
    work; `caches` is mutated. The summary counts requests from `warmup` on."""
    pol = routing_policy(policy, cost, w_idle=None)     # affinity's balance derived, as served
    view = ClusterView(caches, cost.profile)
    free, done = np.zeros(caches.num_instances), []
    n = len(arrivals_ms)
    ttft, svc, local, total = (np.empty(n) for _ in range(4))
    dest = np.empty(n, np.int64)
    for i in range(n):
        t = float(arrivals_ms[i])
        while done and done[0][0] <= t:
            view.queue_depth[heapq.heappop(done)[1]] -= 1
        np.maximum(free - t, 0.0, out=view.outstanding_ms)
        items = w.candidates[i]
        tok = w.item_tokens[items]
        shape = RequestShape(0, 0, 0, 0, int(tok.sum()))
        d = int(pol.choose(RoutingRequest(shape, items, tok), view))
        local[i], total[i] = float(caches.held[d, items] @ tok), shape.item_tokens
        svc[i] = float(cost.service_ms(cost.work(shape, local[i])))
        free[d] = max(t, free[d]) + svc[i]
        heapq.heappush(done, (free[d], d))
        view.queue_depth[d] += 1
        caches.use(d, items)
        ttft[i], dest[i] = free[d] - t, d
    m = slice(warmup, n)
    span_s = max(float(arrivals_ms[-1] - arrivals_ms[warmup]) / 1e3, 1e-9)
    share = np.bincount(dest[m], minlength=caches.num_instances).max() / (n - warmup)
    return {"p50_ms": float(np.percentile(ttft[m], 50)),
            "p99_ms": float(np.percentile(ttft[m], 99)), "mean_ms": float(ttft[m].mean()),
            "mean_service_ms": float(svc[m].mean()),
            "item_hit": float(local[m].sum() / max(total[m].sum(), 1.0)),
            "slo_met": float(np.mean(ttft[m] <= slo_ms)),
            "goodput_rps": float(np.sum(ttft[m] <= slo_ms)) / span_s,
            "max_instance_share": float(share)}
