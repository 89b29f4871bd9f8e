"""Singleflight: concurrent calls for one key run the function once; the others wait for it.

The cache-stampede guard of PAPERS.md §2: when a popular chunk misses, N requests would all
recompute it; with singleflight the first (the leader) computes and the N−1 followers block
until the leader's result (or exception) is available, then share it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


@dataclass
class _Call(Generic[T]):
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None
    waiters: int = 0


class SingleFlight(Generic[T]):
    """Deduplicates concurrent calls per key. Thread-safe; no state outlives a call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call[T]] = {}
        self.leaders = 0   # calls that ran fn
        self.shared = 0    # calls that waited for a leader instead

    def do(self, key: Hashable, fn: Callable[[], T]) -> T:
        """Runs fn() unless a call for `key` is in flight, in which case it waits for that
        call and returns its value (or re-raises its exception)."""
        with self._lock:
            call = self._calls.get(key)
            if call is not None:
                call.waiters += 1
                self.shared += 1
                leader = False
            else:
                call = self._calls[key] = _Call()
                self.leaders += 1
                leader = True
        if not leader:
            call.done.wait()
            if call.error is not None:
                raise call.error
            return call.value  # type: ignore[return-value]
        try:
            call.value = fn()
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()
        return call.value

    def waiters(self, key: Hashable) -> int:
        """Followers currently waiting on the in-flight call for `key` (0 if none)."""
        with self._lock:
            call = self._calls.get(key)
            return call.waiters if call else 0


def get_or_compute(flight: SingleFlight[T], key: Hashable, lookup: Callable[[], T | None],
                   recheck: Callable[[], T | None], compute: Callable[[], T],
                   store: Callable[[T], object]) -> T:
    """A cache's read-through: `lookup()` (the counted look-up), and on a miss `compute()` run
    once per key however many threads miss together, its result passed to `store` and shared.
    The leader calls `recheck()` (an uncounted look-up) first: a leader that finished just
    before it may have stored the value. Exceptions from `compute` reach every waiting caller."""
    found = lookup()
    if found is not None:
        return found

    def lead() -> T:
        again = recheck()
        if again is not None:
            return again
        fresh = compute()
        store(fresh)
        return fresh

    return flight.do(key, lead)
