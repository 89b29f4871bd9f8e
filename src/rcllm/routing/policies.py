"""Routing policies: plain objects that pick an instance for a request.

Each policy has `name` and `choose(request, cluster) -> instance index`; it reads the cluster
view and never mutates it. The same objects drive the simulator and a real router; the
registry (`registry.py`) builds them by name.

- round-robin: instances in turn, blind to load and caches.
- load-only (least-loaded): the least outstanding work; misses caches.
- hit-only (most-hits): the most local item tokens; piles requests onto hot nodes.
- affinity (RcLLM): maximise hit_rate^w_hit · idleness^w_idle with idleness =
  1 / (1 + outstanding / this request's service at its best-hit instance). w_idle = 0 is
  hit-only, w_hit = 0 is load-only; w_idle = None derives it per decision from the cost model
  (`balance.py`: the misses' recompute time against the queue wait, right for any instance
  count; the served router's default); the fixed default 4 comes from a sweep of 40 simulated
  instances (simulator.md).
- cost: the lowest TTFT estimated by the cost model (queue wait + service on that instance).
- prefix-aware: prefix caching as deployed (SGLang's cache-aware router, llm-d's precise prefix
  scorer): the instance holding the request's longest cached prompt prefix, unless its queue
  is longer than the shortest by more than a threshold; then, or where no instance holds any
  of it, load-only.
- user-side: the user-prefix cache as a relay deploys it (RelayGR): the instance holding the
  request's user side (prewarmed there, or left by the user's last ranking), with the same
  balance against load as prefix-aware; a user no instance holds goes by load.
Score ties go to the lower outstanding work, then the lower index; load-only rotates ties.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import numpy as np

from ..errors import RcllmError
from .balance import HIT_FLOOR, decision_weight
from .cost import CostModel
from .requests import is_user_key
from .views import ClusterView, RoutingRequest

class RoutingPolicy(Protocol):
    name: str

    def choose(self, request: RoutingRequest, cluster: ClusterView) -> int:
        """Index of the instance that should serve `request`."""
        ...


class RoundRobin:
    """Instances in turn. Holds its own counter (one policy object per router)."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RoutingRequest, cluster: ClusterView) -> int:
        k = self._next % cluster.num_instances
        self._next = k + 1
        return k


class LoadOnly:
    """The instance with the least outstanding work (Load-Only).

    Ties (several idle instances) rotate instead of always going to the lowest index, so an
    idle cluster still spreads requests; the policy keeps its own rotation pointer.
    """

    name = "load-only"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RoutingRequest, cluster: ClusterView) -> int:
        out = cluster.outstanding_ms
        best = np.flatnonzero(out <= out.min() + 1e-9)
        pick = int(best[np.searchsorted(best, self._next) % len(best)])
        self._next = pick + 1
        return pick


def _argmax_then_least_loaded(score: np.ndarray, cluster: ClusterView) -> int:
    best = np.flatnonzero(score >= score.max() - 1e-12 * max(1.0, abs(score.max())))
    return int(best[np.argmin(cluster.outstanding_ms[best])])


class HitOnly:
    """The instance holding the most of the request's item tokens (Hit-Only)."""

    name = "hit-only"

    def choose(self, request: RoutingRequest, cluster: ClusterView) -> int:
        local = cluster.locality.local_tokens(request.items, request.item_tokens)
        return _argmax_then_least_loaded(local, cluster)


class Affinity:
    """RcLLM's affinity score: expected item hit rate × idleness, with weights as exponents."""

    name = "affinity"

    def __init__(self, cost: CostModel, w_hit: float = 1.0,
                 w_idle: float | None = 4.0) -> None:
        if w_hit < 0 or (w_idle is not None and w_idle < 0):
            raise RcllmError("affinity weights must be >= 0")
        self.cost = cost
        self.w_hit = w_hit
        self.w_idle = w_idle          # None: derived per decision (balance.decision_weight)

    def choose(self, request: RoutingRequest, cluster: ClusterView) -> int:
        total = max(float(request.shape.item_tokens), 1.0)
        local = cluster.locality.local_tokens(request.items, request.item_tokens)
        w_idle = self.w_idle
        if w_idle is None:
            w_idle = decision_weight(self.cost, request.shape, local, cluster.outstanding_ms,
                                     self.w_hit)
            if not np.isfinite(w_idle):       # the misses cost nothing: load decides
                return int(np.argmin(cluster.outstanding_ms))
        hit_rate = local / total
        # idleness in units of this request's own service time at its best instance
        ref_ms = float(self.cost.service_ms(self.cost.work(request.shape, local.max())))
        idleness = 1.0 / (1.0 + cluster.outstanding_ms / ref_ms)
        # the log of hit^w_hit · idleness^w_idle: a large derived weight cannot underflow
        score = self.w_hit * np.log(hit_rate + HIT_FLOOR) + w_idle * np.log(idleness)
        return _argmax_then_least_loaded(score, cluster)


class CostBased:
    """The instance with the lowest estimated TTFT under the cost model."""

    name = "cost"

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def choose(self, request: RoutingRequest, cluster: ClusterView) -> int:
        local = cluster.locality.local_tokens(request.items, request.item_tokens)
        ttft = self.cost.ttft_ms(request.shape, local, cluster.outstanding_ms)
        return int(np.argmin(ttft))


class _HeldUnlessQueued(ABC):
    """Where the most of what the request reuses is held (`held`: tokens per instance), unless
    that instance's queue holds more than `max_extra_requests` beyond the shortest; then, or
    where no instance holds any, by load (`LoadOnly`, its ties rotating). Ties between equal
    holdings go to the less outstanding work. An rcllm instance runs one request at a time, so
    one request queued ahead costs a whole service time, more than a prefix or a user side
    saves: the default lets the holding win by at most one queued request."""

    name = ""

    def __init__(self, max_extra_requests: int = 1) -> None:
        if max_extra_requests < 0:
            raise RcllmError(f"{self.name}: max_extra_requests must be >= 0")
        self.max_extra_requests = max_extra_requests
        self._load = LoadOnly()

    @abstractmethod
    def held(self, request: RoutingRequest, cluster: ClusterView) -> np.ndarray:
        """Per instance, how much of the request it holds (0: nothing)."""

    def choose(self, request: RoutingRequest, cluster: ClusterView) -> int:
        matched = self.held(request, cluster)
        if matched.max() <= 0:
            return self._load.choose(request, cluster)
        pick = _argmax_then_least_loaded(matched, cluster)
        if cluster.queue_depth[pick] - cluster.queue_depth.min() > self.max_extra_requests:
            return self._load.choose(request, cluster)
        return pick


class PrefixAware(_HeldUnlessQueued):
    """The instance whose prefix cache holds the longest prefix of the request's prompt
    (`cluster.prefixes`, the router's picture: `prefixes.PrefixIndex`), balanced against load
    as SGLang's cache-aware router does (`_HeldUnlessQueued`). SGLang's default imbalance
    threshold (64 requests) is for engines that batch dozens of requests; here one queued
    request is the default."""

    name = "prefix-aware"

    def held(self, request: RoutingRequest, cluster: ClusterView) -> np.ndarray:
        if cluster.prefixes is None:
            raise RcllmError("prefix-aware routing needs the cluster's prefix picture "
                             "(ClusterView.prefixes); this view has none")
        return cluster.prefixes.matched_tokens(request.prefix, request.prefix_tokens)


class UserSide(_HeldUnlessQueued):
    """The instance holding the request's user side: the routing item `requests.user_key`,
    which the router's view counts as held on the instance whose side can serve the request
    (`serve.views.UserResidency`: a relay's prewarm there, or the user's last ranking),
    balanced against load as `PrefixAware` is (`_HeldUnlessQueued`). RcllmError for a request
    that carries no user side (a listwise deployment's, or the simulator's requests): there is
    nothing to route by."""

    name = "user-side"

    def held(self, request: RoutingRequest, cluster: ClusterView) -> np.ndarray:
        side = [k for k, item in enumerate(request.items) if is_user_key(item)]
        if not side:
            raise RcllmError("user-side routing needs the request's user side (a pointwise "
                             "deployment, whose user-prefix cache holds it); this request "
                             "carries none")
        k = side[0]
        return cluster.locality.local_tokens([request.items[k]], request.item_tokens[k:k + 1])
