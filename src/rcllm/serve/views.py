"""The router's live picture of its instances, in the form `rcllm.schedule` policies read.

Contract: mutated only on the router's event loop (no locks). `inflight` counts requests sent
to an instance and not yet answered (the router is the only sender, so it is exact);
`outstanding_ms` sums the cost model's service estimate of those requests, so load and the
policy's own service estimate are in the same units (as in the simulator); `service_ms` is
the measured EWMA, used only for Retry-After. `cached` starts as the
instance's placement (shard + hot items) and grows with the items it served, since chunk
misses are cached after the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..schedule import ClusterView, InstanceView, RequestShape, RoutingRequest, SpeedProfile

# Token estimates for routing only (the engine counts real tokens); a request's own items use
# the counts reported by an instance when known.
PREFIX_TOKENS, TOKENS_PER_HISTORY, TOKENS_PER_ITEM, HISTORY_WINDOW = 60, 60, 64, 10


@dataclass
class LiveInstance:
    index: int
    cached: set[str]
    inflight: int = 0
    outstanding_ms: float = 0.0
    service_ms: float = 200.0
    alive: bool = True
    served: int = 0
    failures: list[str] = field(default_factory=list)

    def view(self, profile: SpeedProfile) -> InstanceView:
        return InstanceView(self.index, self.inflight, self.outstanding_ms, self.cached, profile)

    def started(self, estimate_ms: float) -> None:
        self.inflight += 1
        self.outstanding_ms += estimate_ms

    def abandoned(self, estimate_ms: float) -> None:
        self.inflight -= 1
        self.outstanding_ms = max(0.0, self.outstanding_ms - estimate_ms)

    def finished(self, estimate_ms: float, ms: float, items: list[str]) -> None:
        self.abandoned(estimate_ms)
        self.served += 1
        self.service_ms = 0.8 * self.service_ms + 0.2 * ms
        self.cached.update(items)


def routing_request(payload: dict, item_tokens: dict[str, int]) -> RoutingRequest:
    items = list(payload["candidates"])
    tokens = [item_tokens.get(i, TOKENS_PER_ITEM) for i in items]
    hist = min(len(payload["history"]), HISTORY_WINDOW) * TOKENS_PER_HISTORY
    shape = RequestShape(prefix_tokens=PREFIX_TOKENS, fresh_tokens=20 + 4 * len(items),
                         history_tokens=hist, history_hit_tokens=hist, item_tokens=sum(tokens))
    return RoutingRequest(shape, items, np.asarray(tokens, dtype=np.int64))


def cluster_view(instances: list[LiveInstance], profile: SpeedProfile) -> ClusterView:
    return ClusterView.from_instances([i.view(profile) for i in instances])
