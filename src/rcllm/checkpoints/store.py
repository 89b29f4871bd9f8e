"""A byte-bounded store of recurrent-state checkpoints, indexed by (prefix, position).

Why not `rcllm.kvstore.MemoryLRUStore`: that store answers exact-key lookups of position-free
chunks. A checkpoint lookup is a *floor* query — the deepest stored position <= the request's
overlap depth — so each prefix keeps a sorted position list beside the LRU map. Values are any
object with `nbytes` (a `RecurrentState`); the store does not import torch.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from typing import NewType, Protocol

PrefixId = NewType("PrefixId", str)


class Snapshot(Protocol):
    position: int

    @property
    def nbytes(self) -> int: ...


class CheckpointStore:
    """LRU-by-bytes store of snapshots. Thread-safe.

    put() evicts least-recently-used checkpoints (of any prefix) to fit; a snapshot larger than
    the capacity is refused (returns False). deepest() returns None on a miss and never raises
    for an unknown prefix; a hit refreshes that checkpoint's recency. Stored snapshots are
    shared, not copied: callers must not modify them (clone before mutating).
    """

    def __init__(self, capacity_bytes: int = 1 << 30):
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[tuple[PrefixId, int], Snapshot] = OrderedDict()
        self._positions: dict[PrefixId, list[int]] = {}  # sorted, per prefix
        self._nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def put(self, prefix: PrefixId, snapshot: Snapshot) -> bool:
        """Stores the snapshot at (prefix, snapshot.position), replacing any old one there."""
        if snapshot.position < 1:
            raise ValueError("a checkpoint position must be >= 1 (position 0 is the free zero state)")
        size = snapshot.nbytes
        if size > self.capacity_bytes:
            return False
        key = (prefix, snapshot.position)
        with self._lock:
            if key in self._entries:
                self._drop(key)
            while self._entries and self._nbytes + size > self.capacity_bytes:
                self._drop(next(iter(self._entries)))
                self.evictions += 1
            self._entries[key] = snapshot
            self._nbytes += size
            bisect.insort(self._positions.setdefault(prefix, []), snapshot.position)
        return True

    def _drop(self, key: tuple[PrefixId, int]) -> None:
        """Removes one entry and its index row; the caller holds the lock."""
        snap = self._entries.pop(key)
        self._nbytes -= snap.nbytes
        plist = self._positions[key[0]]
        del plist[bisect.bisect_left(plist, key[1])]
        if not plist:
            del self._positions[key[0]]

    def deepest(self, prefix: PrefixId, depth: int) -> Snapshot | None:
        """The stored snapshot of `prefix` with the largest position <= depth, or None."""
        with self._lock:
            plist = self._positions.get(prefix, [])
            i = bisect.bisect_right(plist, depth)
            if i == 0:
                self.misses += 1
                return None
            key = (prefix, plist[i - 1])
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key]

    def positions(self, prefix: PrefixId) -> tuple[int, ...]:
        with self._lock:
            return tuple(self._positions.get(prefix, ()))

    def remove_prefix(self, prefix: PrefixId) -> int:
        """Drops every checkpoint of `prefix`; returns how many were dropped."""
        with self._lock:
            keys = [(prefix, p) for p in self._positions.get(prefix, ())]
            for key in keys:
                self._drop(key)
            return len(keys)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def check_invariants(self) -> None:
        """Byte total matches the entries, within budget, and the position index mirrors the map."""
        with self._lock:
            total = sum(s.nbytes for s in self._entries.values())
            assert total == self._nbytes, f"byte accounting off: {total} != {self._nbytes}"
            assert self._nbytes <= self.capacity_bytes, "store over its byte budget"
            for (prefix, pos), snap in self._entries.items():
                assert snap.position == pos, f"entry at {pos} holds a snapshot of {snap.position}"
            index = {(prefix, p) for prefix, plist in self._positions.items() for p in plist}
            assert index == set(self._entries), "position index out of sync with entries"
            for plist in self._positions.values():
                assert plist and plist == sorted(set(plist)), "position list unsorted or empty"
