"""Admission in front of the Ray instances: at most `queue_size` requests in flight per
instance; a request no instance has room for is refused (429, `worker.Overloaded`) with a
Retry-After estimate. Admission happens once per request: a retry of an admitted request
(its instance died or timed out) is never refused (`router.RayBackend._route`)."""

from __future__ import annotations

from dataclasses import dataclass

from .views import LiveInstance
from .worker import Overloaded


@dataclass(frozen=True)
class Admission:
    queue_size: int         # requests in flight per instance (sent and not yet answered)

    def admit(self, live: list[LiveInstance], everyone: list[LiveInstance]
              ) -> list[LiveInstance]:
        """Those of `live` with room for one more request; Overloaded when none has, with the
        Retry-After of `everyone` (the deployment's instances)."""
        room = [i for i in live if i.inflight < self.queue_size]
        if not room:
            raise Overloaded(retry_after_s(everyone))
        return room


def retry_after_s(instances: list[LiveInstance]) -> int:
    """Seconds until the usable instance with the least queued work (its requests in flight
    × its measured service time) could take a request; at least 1."""
    live = [i for i in instances if i.usable] or instances
    wait_ms = min(i.inflight * i.service_ms for i in live)
    return max(1, int(wait_ms / 1e3 + 0.999))
