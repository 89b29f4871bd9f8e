"""The relay's torch-free policy parts: configuration, the trigger and the affinity router.

Trigger (sequence-aware admission of a pre-inference):
- the user side has at least `min_prefix_tokens` tokens (shorter prefixes are cheap enough to
  compute inside the ranking request without risking the SLO);
- footprint: the instance's resident prefix bytes plus this one stay within `max_cache_bytes`;
- load: fewer than `max_inflight` pre-inferences are running (or queued) on the instance.

Router: rendezvous (highest-random-weight) hashing of the user key, so a prewarm and the later
ranking of one user land on the same instance, and adding an instance moves only ~1/K users.
Used by `relay.Relay` and by the simulation (`relay_sim`), which must not import torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from ..errors import RcllmError
from ..records import UserId


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
