"""Pre-inference relay (RelayGR, PAPERS.md §4): the `prewarm(user)` signal and its routing.

An upstream stage (retrieval) knows a user will be ranked soon and calls `prewarm(user)`. The
affinity router sends the signal — and later the ranking request — to the same instance; the
trigger (`trigger.py`) admits the pre-inference only when the prefix is long enough to risk the
SLO, the instance's cache footprint allows it and its pre-inference load is under the bound. An
admitted prewarm computes the prefix into that instance's cache, so the ranking hits it.
Evicted prefixes spill to host memory when the cache has a spill tier (the expander).
"""

from __future__ import annotations

import threading
from typing import Mapping, Sequence

from ..errors import RcllmError
from ..records import HistoryEntry, ItemId, UserId
from .ranker import Scored, UserPrefixRanker
from .trigger import Admission, AffinityRouter, RelayConfig, Trigger

__all__ = ["Admission", "AffinityRouter", "Relay", "RelayConfig", "Trigger",
           "prefix_bytes_per_token"]


def prefix_bytes_per_token(ranker: UserPrefixRanker) -> int:
    """Bytes one user-side token occupies in the cache (K and V, all layers)."""
    a = ranker.model.arch
    lanes = 2 * a.num_layers * a.num_kv_heads * a.head_dim
    return lanes * (1 if ranker.cache.cfg.int8 else ranker.model.embed_tokens.element_size())


class Relay:
    """Routes prewarms and rankings over named instances (one ranker each). Thread-safe."""

    def __init__(self, instances: Mapping[str, UserPrefixRanker],
                 users: Mapping[UserId, Sequence[HistoryEntry]], cfg: RelayConfig = RelayConfig()):
        self.instances = dict(instances)
        self.users = users
        self.trigger = Trigger(cfg)
        self.router = AffinityRouter(list(self.instances))
        self._lock = threading.Lock()
        self._inflight = {name: 0 for name in self.instances}
        self.decisions: dict[str, int] = {}

    def _history(self, user_id: UserId) -> Sequence[HistoryEntry]:
        history = self.users.get(user_id)
        if history is None:
            raise RcllmError(f"prewarm/rank for unknown user {user_id!r}")
        return history

    def prewarm(self, user_id: UserId) -> Admission:
        """Pre-infers the user's prefix on the user's instance if the trigger admits it.
        RcllmError for an unknown user or a history over `max_prefix_tokens`."""
        history = self._history(user_id)
        name = self.router.route(user_id)
        ranker = self.instances[name]
        side = ranker.prompt.user_side(user_id, history)
        tokens = len(side.ids)
        if tokens > self.trigger.cfg.max_prefix_tokens:
            raise RcllmError(f"prewarm for {user_id!r}: {tokens} prefix tokens, over the relay "
                             f"limit of {self.trigger.cfg.max_prefix_tokens}")
        with self._lock:
            resident = ranker.cache.latest(user_id)
            if resident is not None and resident.history_hash == side.history_hash:
                return self._count(Admission(False, "cached", name, tokens))
            decision = self.trigger.decide(tokens, tokens * prefix_bytes_per_token(ranker),
                                           ranker.cache.nbytes, self._inflight[name])
            decision = Admission(decision.admitted, decision.reason, name, tokens)
            self._count(decision)
            if not decision.admitted:
                return decision
            self._inflight[name] += 1
        try:
            ranker.prefix(user_id, history, count=False)
        finally:
            with self._lock:
                self._inflight[name] -= 1
        return decision

    def rank(self, user_id: UserId, candidates: Sequence[ItemId]) -> tuple[str, Scored]:
        """(the instance that ranked, its scores) — the same instance `prewarm` used."""
        name = self.router.route(user_id)
        return name, self.instances[name].score(user_id, self._history(user_id), candidates)

    def _count(self, decision: Admission) -> Admission:
        self.decisions[decision.reason] = self.decisions.get(decision.reason, 0) + 1
        return decision
