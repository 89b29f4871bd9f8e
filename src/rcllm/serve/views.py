"""The router's live picture of its instances, in the form `rcllm.routing` policies read.

Contract: mutated only on the router's event loop (no locks). `inflight` counts requests sent
to an instance and not yet answered (the router is the only sender, so it is exact);
`outstanding_ms` sums the cost model's service estimate of those requests, so load and the
policy's own service estimate are in the same units (as in the simulator); `service_ms` is
the measured EWMA, used only for Retry-After. `cached` starts as the
instance's placement (shard + hot items) that stayed in its store and grows with the items it
served, since chunk misses are cached after the answer; an answer after an eviction carries the
items the store lost, which leave it (`EngineHost.lost_items`). Beside a shared Redis tier,
`tier` is the router's one picture of what the tier holds (`serve.tier.SharedTier.held`, the
same set object on every instance): an item there is local everywhere, beside `cached`. `suspect`: a call to it timed
out; it gets no requests until a probe (`health.Health`'s probe thread, which clears the flag)
finds its engine free again.

User-prefix residency (pointwise deployments): `UserResidency` records which instance holds
each user's user side (the instance that last prewarmed or ranked the user), and the routing
request carries the user side as one more "item", `user_key(user_id)`, whose tokens count as
local on that instance only. So every policy that reads locality (affinity, hit-only, cost)
weighs the resident user side like item shards, and a prewarm and the user's next ranking
land on the same instance unless load outweighs it. A side counts only for a request it can
serve (the same history window, or one that extends it), as the engine's look-up decides.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Iterator

from ..routing import ClusterView, InstanceView, SpeedProfile
from ..routing.prefixes import PrefixIndex, PrefixView
from ..routing.requests import entry_key
from ..routing.requests import routing_request, user_key  # noqa: F401 (the router's, read here)


@dataclass
class LiveInstance:
    index: int
    cached: set[str]
    inflight: int = 0
    outstanding_ms: float = 0.0
    service_ms: float = 200.0
    alive: bool = True
    suspect: bool = False
    served: int = 0
    failures: list[str] = field(default_factory=list)
    tier: set[str] | None = None        # the shared tier's items (one set for all); None: none
    # monotonic time of the last answer (or of creation): an instance that answers calls is
    # busy, not stuck, whatever the wait of one call queued behind others (health.wait_answer)
    last_answer_s: float = field(default_factory=time.monotonic)

    @property
    def usable(self) -> bool:
        """Alive and not waiting for a probe: may be sent requests."""
        return self.alive and not self.suspect

    def view(self, profile: SpeedProfile, extra: frozenset = frozenset()) -> InstanceView:
        parts = [p for p in (extra, self.tier) if p]
        held = self.cached if not parts else _Union(self.cached, *parts)
        return InstanceView(self.index, self.inflight, self.outstanding_ms, held, profile)

    def started(self, estimate_ms: float) -> None:
        self.inflight += 1
        self.outstanding_ms += estimate_ms

    def abandoned(self, estimate_ms: float) -> None:
        self.inflight -= 1
        self.outstanding_ms = max(0.0, self.outstanding_ms - estimate_ms)

    def finished(self, estimate_ms: float, ms: float, items: list[str],
                 lost: list[str] | None = None) -> None:
        """An answer: `lost`, when the instance's store dropped item KV since its last answer,
        leaves `cached` first (O(lost): the instance reports what it lost, never its whole
        list); then `items` (the request's candidates, whose misses are being built behind)
        join it."""
        self.last_answer_s = time.monotonic()
        self.abandoned(estimate_ms)
        self.served += 1
        self.service_ms = 0.8 * self.service_ms + 0.2 * ms
        if lost:
            self.cached.difference_update(lost)
        self.cached.update(items)


def live_instances(held: list[list[str]], tier: set[str] | None = None) -> list[LiveInstance]:
    """The router's instances, each starting with the items placed on it that its store kept.
    Beside a shared tier (Redis) an item chunk built on any instance is written behind to the
    tier and read through from it by the others (a Redis read, milliseconds, against a
    recompute): `tier`, the router's picture of what the tier holds, then counts as held on
    every instance (the same set object), so an item the tier holds stops pulling requests
    towards one instance, and one it evicted pulls towards the instances whose memory still
    holds it."""
    return [LiveInstance(k, set(items), tier=tier) for k, items in enumerate(held)]


class _Union:
    """The union of `sets` for membership tests and iteration, without copying them."""

    def __init__(self, *sets) -> None:
        self.sets = sets

    def __contains__(self, x: object) -> bool:
        return any(x in s for s in self.sets)

    def __iter__(self) -> Iterator[Hashable]:
        for k, s in enumerate(self.sets):
            yield from (x for x in s if not any(x in t for t in self.sets[:k]))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class UserResidency:
    """Which instance holds each user's user side, as the router learns it from its own
    prewarm and rank answers. An entry expires after `ttl_s` (the cache's longest TTL), and at
    most `max_users` are kept (least recently noted dropped first), so the map is bounded.

    With `history_window` (the engine's `prompt.history_window`; 0: unknown) the map also keeps
    the history the user side was built from, and `home(user, history)` names the instance only
    where that side can serve the new request the way the engine's look-up would: the same
    window (a hit) or a shorter one the new window extends (an append). A returning user whose
    window slid (the oldest review dropped) has no usable side anywhere, so no policy is pulled
    towards an instance that would compute it all again."""

    def __init__(self, ttl_s: float, max_users: int = 100_000, clock=time.monotonic,
                 history_window: int = 0) -> None:
        self.ttl_s = ttl_s
        self.max_users = max_users
        self.history_window = history_window
        self._clock = clock
        self._homes: OrderedDict[str, tuple[int, float, tuple | None]] = OrderedDict()

    def _kept(self, history) -> tuple | None:
        if history is None or not self.history_window:
            return None
        return tuple(entry_key(e) for e in list(history)[-self.history_window:])

    def note(self, user_id: str, index: int, history=None) -> None:
        self._homes[user_id] = (index, self._clock() + self.ttl_s, self._kept(history))
        self._homes.move_to_end(user_id)
        while len(self._homes) > self.max_users:
            self._homes.popitem(last=False)

    def home(self, user_id: str, history=None) -> int | None:
        """The instance holding the user's side, or None; given the new request's `history`,
        None also where that side cannot serve it (neither its window nor a prefix of it)."""
        row = self._homes.get(user_id)
        if row is None:
            return None
        if row[1] <= self._clock():
            del self._homes[user_id]
            return None
        kept, built = self._kept(history), row[2]
        if kept is not None and built is not None and not (
                len(built) <= len(kept) and kept[:len(built)] == built):
            return None
        return row[0]

    def drop(self, user_id: str, index: int) -> None:
        """Forgets `user_id`'s side if it is noted on instance `index` (a failed prewarm)."""
        row = self._homes.get(user_id)
        if row is not None and row[0] == index:
            del self._homes[user_id]

    def forget_instance(self, index: int) -> None:
        for user in [u for u, row in self._homes.items() if row[0] == index]:
            del self._homes[user]

    def __len__(self) -> int:
        return len(self._homes)


def cluster_view(instances: list[LiveInstance], profile: SpeedProfile,
                 user_id: str | None = None, home: int | None = None,
                 prefixes: PrefixIndex | None = None) -> ClusterView:
    """The policy's view of `instances`; `home` (an instance index) holds `user_id`'s user
    side; `prefixes`: the router's picture of the prefix caches (None: none kept)."""
    extra = frozenset([user_key(user_id)]) if user_id is not None else frozenset()
    return ClusterView.from_instances(
        [i.view(profile, extra if i.index == home else frozenset()) for i in instances],
        None if prefixes is None else PrefixView(prefixes, [i.index for i in instances]))
