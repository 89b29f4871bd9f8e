"""The expander (RelayGR): a host-memory tier that keeps evicted prefixes for short-term reuse.

When the device-side prefix cache evicts an entry (LRU by bytes), the entry moves here instead
of being dropped; a request for the same key within `ttl_s` takes it back without recomputing
the prefix. The tier is bounded by bytes (oldest spilled first out) and its entries expire.
Entries are moved to CPU memory (a no-op when the model runs on CPU).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Callable

from .entry import CachedPrefix, PrefixKey
from ..records import UserId


class HostSpill:
    """Thread-safe byte-bounded, expiring store of spilled prefixes."""

    def __init__(self, max_bytes: int, ttl_s: float, clock: Callable[[], float]):
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[PrefixKey, tuple[CachedPrefix, float]] = OrderedDict()
        self._bytes = 0
        self.spilled = 0
        self.dropped = 0   # evicted from this tier, or too large for it

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: CachedPrefix) -> None:
        """Takes an evicted entry (moved to CPU); drops the oldest while over budget."""
        size = entry.stored.nbytes
        with self._lock:
            if size > self.max_bytes:
                self.dropped += 1
                return
            self._remove(entry.key)
            self._entries[entry.key] = (replace(entry, stored=entry.stored.to("cpu")),
                                        self._clock() + self.ttl_s)
            self._bytes += size
            self.spilled += 1
            while self._bytes > self.max_bytes:
                key = next(iter(self._entries))
                self._remove(key)
                self.dropped += 1

    def take(self, key: PrefixKey) -> CachedPrefix | None:
        """Removes and returns the entry for `key`, or None when absent or expired."""
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            self._remove(key)
            return item[0] if item[1] > self._clock() else None

    def take_user(self, user_id: UserId) -> CachedPrefix | None:
        """Removes and returns the newest unexpired entry of `user_id` (for appends)."""
        with self._lock:
            keys = [k for k, (e, _) in self._entries.items() if e.user_id == user_id]
        for key in reversed(keys):
            entry = self.take(key)
            if entry is not None:
                return entry
        return None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _remove(self, key: PrefixKey) -> None:
        item = self._entries.pop(key, None)
        if item is not None:
            self._bytes -= item[0].stored.nbytes

    def check_invariants(self) -> None:
        with self._lock:
            total = sum(e.stored.nbytes for e, _ in self._entries.values())
            assert total == self._bytes, f"spill bytes {self._bytes} != entries {total}"
            assert self._bytes <= self.max_bytes, "spill tier over its byte budget"
