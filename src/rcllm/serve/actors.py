"""The K instance actors of a Ray deployment and the calls that go to all of them.

`InstanceActors` starts Ray (or joins it) and the actors, holds their handles, and answers
the calls that are not a routed request: the catalog's changes replicated to every live
instance (`on_all`), the fault-injection hooks the tests use, and the measurements `bench
serve` takes (pids, niceness, the reference pass). A routed request goes through the router
(`router.RayBackend`), which calls one handle.
"""

from __future__ import annotations

from typing import Any

from .cluster_start import init_ray
from .health import Health
from .instance import Instance
from .spec import EngineSpec
from .views import LiveInstance
from .worker import Unavailable


class InstanceActors:
    def __init__(self, spec: EngineSpec, num_instances: int, queue_size: int,
                 address: str | None, object_store_bytes: int) -> None:
        import ray

        self._ray = ray
        self.owns_ray = init_ray(address, object_store_bytes)
        actor = ray.remote(num_cpus=0, max_concurrency=queue_size + 2, max_restarts=0)(Instance)
        self.handles = [actor.remote(k, spec) for k in range(num_instances)]
        # who each instance is (`Instance.ping`): its user-prefix TTL, history window, ...
        self.pings: list[dict[str, Any]] = self.get_all("ping")

    def get_all(self, method: str, *args) -> list[Any]:
        """`method` on every actor, waited for (start-up and measurements: no fault handling)."""
        return self._ray.get([getattr(a, method).remote(*args) for a in self.handles])

    def get(self, index: int, method: str, *args, timeout: float | None = None) -> Any:
        return self._ray.get(getattr(self.handles[index], method).remote(*args),
                             timeout=timeout)

    def on_all(self, instances: list[LiveInstance], health: Health, method: str,
               *args) -> list[Any]:
        """Calls `method` on every live instance and returns the answers of the usable ones.
        A suspect instance gets the call too (it runs once its engine is free, so it does not
        miss a catalog change) but is not waited for; one that does not answer within 30 s
        becomes suspect, one whose actor died is marked dead."""
        from ray.exceptions import GetTimeoutError

        refs = [(i, getattr(self.handles[i.index], method).remote(*args))
                for i in instances if i.alive]
        out = []
        for inst, ref in refs:
            if inst.suspect:
                continue
            try:
                out.append(self._ray.get(ref, timeout=30))
            except GetTimeoutError:
                health.suspect(inst, f"{method} got no answer within 30 s")
            except Exception as exc:  # noqa: BLE001 - a dead instance
                health.lost(inst, exc)
        if not out:
            raise Unavailable("no live instance")
        return out

    def kill(self, index: int) -> None:
        """Kills one actor (fault injection for tests); the router finds out on its next call."""
        self._ray.kill(self.handles[index], no_restart=True)

    def close(self) -> None:
        """Kills every actor, then shuts Ray down when this deployment started it."""
        for a in self.handles:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        if self.owns_ray:
            self._ray.shutdown()
