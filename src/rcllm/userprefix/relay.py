"""Pre-inference relay (RelayGR, PAPERS.md §4): prewarm signal, trigger, affinity router.

An upstream stage (retrieval) knows a user will be ranked soon and calls `prewarm(user)`. The
router sends the signal — and later the ranking request — to the same instance (rendezvous
hashing on the user key: stable, and only ~1/K of users move when an instance is added). The
trigger admits the pre-inference only when it pays and is affordable:

- sequence-aware: the user side has at least `min_prefix_tokens` tokens (shorter prefixes are
  cheap enough to compute inside the ranking request without risking the SLO);
- footprint: the instance's resident prefix bytes plus this one stay within `max_cache_bytes`;
- load: fewer than `max_inflight` pre-inferences are running on the instance.

An admitted prewarm computes the prefix into the instance's cache; the ranking request then
hits it. Evicted prefixes spill to host memory when the cache has a spill tier (the expander).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import RcllmError
from ..records import HistoryEntry, ItemId, UserId
from .ranker import Scored, UserPrefixRanker


@dataclass(frozen=True)
class RelayConfig:
    min_prefix_tokens: int = 1024    # shorter user sides are computed inside the request
    max_prefix_tokens: int = 4096    # longer histories are rejected (RcllmError)
    max_cache_bytes: int = 256 << 20 # per instance: resident prefixes + an admitted one
    max_inflight: int = 2            # per instance: concurrent pre-inferences

    def validate(self) -> None:
        if not 0 <= self.min_prefix_tokens <= self.max_prefix_tokens:
            raise RcllmError("relay: need 0 <= min_prefix_tokens <= max_prefix_tokens")
        if self.max_cache_bytes <= 0 or self.max_inflight < 1:
            raise RcllmError("relay: max_cache_bytes must be > 0 and max_inflight >= 1")


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str          # "admitted", "short", "footprint", "load" or "cached"
    instance: str = ""
    prefix_tokens: int = 0


class Trigger:
    """The sequence-aware admission rule; pure (no state), so the simulator uses it too."""

    def __init__(self, cfg: RelayConfig):
        cfg.validate()
        self.cfg = cfg

    def decide(self, prefix_tokens: int, prefix_bytes: int, resident_bytes: int,
               inflight: int) -> Admission:
        if prefix_tokens < self.cfg.min_prefix_tokens:
            return Admission(False, "short", prefix_tokens=prefix_tokens)
        if resident_bytes + prefix_bytes > self.cfg.max_cache_bytes:
            return Admission(False, "footprint", prefix_tokens=prefix_tokens)
        if inflight >= self.cfg.max_inflight:
            return Admission(False, "load", prefix_tokens=prefix_tokens)
        return Admission(True, "admitted", prefix_tokens=prefix_tokens)


def _weight(user_key: str, instance: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{instance}\0{user_key}".encode()).digest()[:8], "big")


class AffinityRouter:
    """Rendezvous (highest-random-weight) hashing of user keys onto instance names."""

    def __init__(self, instances: Sequence[str]):
        if not instances or len(set(instances)) != len(instances):
            raise RcllmError("relay: need at least one instance, with distinct names")
        self.instances = tuple(instances)

    def route(self, user_id: UserId) -> str:
        return max(self.instances, key=lambda inst: _weight(user_id, inst))


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
