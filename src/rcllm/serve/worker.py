"""A bounded request queue in front of one engine: one worker thread runs one job at a time.

`submit` never blocks: when `capacity` jobs are already admitted (waiting or running) it raises
`Overloaded` with a Retry-After estimate, so memory stays bounded under any load. Admitted jobs
are always run and answered (their future resolves), even when the caller has gone away.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

log = logging.getLogger(__name__)


class Overloaded(Exception):
    """The queue is full; retry after `retry_after_s` seconds."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"overloaded; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Unavailable(Exception):
    """No instance can serve the request (all dead or not started)."""


class EngineWorker:
    def __init__(self, capacity: int, name: str = "rcllm-engine") -> None:
        self.capacity = capacity
        self._jobs: queue.Queue = queue.Queue(maxsize=capacity)
        self._admitted = 0              # waiting + running; guarded by _mu
        self._mu = threading.Lock()
        self._service_ms = 100.0        # EWMA of job time, for Retry-After
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs admitted and not yet finished (waiting or running)."""
        return self._admitted

    @property
    def service_ms(self) -> float:
        return self._service_ms

    def retry_after_s(self) -> int:
        return max(1, math.ceil(self._admitted * self._service_ms / 1e3))

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Admits `fn` or raises Overloaded; the future carries its result or exception."""
        fut: Future = Future()
        with self._mu:
            if self._admitted >= self.capacity:
                raise Overloaded(self.retry_after_s())
            self._admitted += 1
        self._jobs.put_nowait((fn, fut))   # cannot be full: admitted <= capacity
        return fut

    def close(self) -> None:
        """Stops the thread after the jobs already admitted."""
        self._jobs.put((None, None))
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if fn is None:
                return
            t0 = time.perf_counter()
            result, error = None, None
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    error = exc
            ms = (time.perf_counter() - t0) * 1e3
            self._service_ms = 0.8 * self._service_ms + 0.2 * ms
            with self._mu:                    # leave the queue before the caller hears back
                self._admitted -= 1
            if error is not None:
                fut.set_exception(error)
            elif fut.running():
                fut.set_result(result)
