"""Which Ray instances may be sent requests, as the router learns it from its calls.

A call that fails because its actor died marks the instance dead (for good: `max_restarts=0`);
a call that gets no answer while the instance answers nothing for `call_timeout_s` marks it
suspect: it gets no requests (it may be stuck or just slow; what it computes still completes)
until the probe thread finds its engine free again and re-admits it. The router retries either
request elsewhere. Flags live on `views.LiveInstance` (`alive`, `suspect`, `failures`), read by
the router's event loop; the probe thread only clears `suspect` or sets `alive` False.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

from .views import LiveInstance

log = logging.getLogger(__name__)


async def wait_answer(inst: LiveInstance, ref, timeout_s: float) -> dict[str, Any]:
    """The answer behind the Ray object `ref`. TimeoutError once `inst` has answered nothing
    (this call nor any other) for `timeout_s`: a call queued behind others on a busy instance
    that keeps answering is waited for (before, such a call timed out under sustained load
    above capacity, and both instances of a soak were marked suspect: every request 503)."""
    fut = asyncio.wrap_future(ref.future())
    started = time.monotonic()
    while True:
        deadline = max(started, inst.last_answer_s) + timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(fut),
                                          max(0.01, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            if time.monotonic() >= max(started, inst.last_answer_s) + timeout_s:
                fut.cancel()
                raise


class Health:
    """Marks instances dead or suspect and runs the probe thread that re-admits the suspect.
    `probe(index, timeout_s)` returns a Ray object ref of the instance's `probe`;
    `on_dead(index)` is told when an instance is found dead (the router's picture forgets
    what it held)."""

    def __init__(self, instances: list[LiveInstance], probe: Callable[[int, float], Any],
                 on_dead: Callable[[int], None], call_timeout_s: float = 60.0,
                 probe_interval_s: float = 2.0) -> None:
        self.instances = instances
        self._probe = probe
        self._on_dead = on_dead
        self.call_timeout_s = call_timeout_s
        self.probe_interval_s = probe_interval_s
        self.readmitted = 0             # suspect instances a probe re-admitted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe_loop, name="rcllm-probe",
                                        daemon=True)

    def start(self) -> "Health":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.probe_interval_s + 15)

    async def answer(self, inst: LiveInstance, ref) -> dict[str, Any]:
        return await wait_answer(inst, ref, self.call_timeout_s)

    def lost(self, inst: LiveInstance, exc: BaseException) -> None:
        """`inst`'s actor died: no more requests, ever."""
        if inst.alive:
            log.warning("instance %d is dead (%s); its requests go elsewhere", inst.index,
                        type(exc).__name__)
        inst.alive = False
        inst.failures.append(type(exc).__name__)
        self._on_dead(inst.index)

    def suspect(self, inst: LiveInstance, why: str) -> None:
        """No requests for `inst` until a probe finds its engine free (it may be stuck or
        just slow: it is not declared dead, and what it is computing still completes)."""
        if not inst.suspect:
            log.warning("instance %d is suspect (%s); requests go elsewhere until a probe "
                        "answers", inst.index, why)
        inst.suspect = True
        inst.failures.append("timeout")

    def _probe_loop(self) -> None:
        """Every `probe_interval_s`: each suspect instance gets one probe (its engine lock
        within the interval); a True answer re-admits it, a dead actor is marked dead."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        wait = self.probe_interval_s
        while not self._stop.wait(wait):
            for inst in [i for i in self.instances if i.alive and i.suspect]:
                try:
                    ok = ray.get(self._probe(inst.index, wait), timeout=wait + 10)
                except (RayActorError, ActorUnavailableError) as exc:
                    self.lost(inst, exc)
                    continue
                except GetTimeoutError:
                    continue
                except Exception:  # noqa: BLE001 - Ray shutting down under us
                    return
                if ok:
                    inst.suspect = False
                    self.readmitted += 1
                    log.warning("instance %d answers its probe again: re-admitted", inst.index)
