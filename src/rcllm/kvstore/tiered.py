"""Memory → disk → Redis, behind the one KVStore interface.

Reads are read-through: a hit in a lower tier is returned and promoted (into memory at once,
into the tiers between asynchronously). Writes are write-behind: put() stores in memory and
queues the lower-tier saves for a background thread (CachedAttention's asynchronous saving), so
the request path never waits on disk or network. Until a queued save lands, get() serves the
entry from the pending table, so an entry is never briefly invisible.

The write queue is bounded (`queue_size`); when it is full put() waits up to
`enqueue_timeout_s`, then drops the lower-tier save (counted in `dropped_writes`; memory still
has it). A second background thread serves `prefetch(keys)`: scheduler hints that warm the
memory tier for queued requests.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Iterable, Sequence

from .base import ChunkKey, ChunkKV, InlineBuilds, KVStore, MemoryLRUStore
from .singleflight import SingleFlight, get_or_compute

log = logging.getLogger(__name__)
_STOP = object()


class TieredStore(InlineBuilds):
    """KVStore over `memory` (fastest) and `lower` tiers (fastest first). Thread-safe.

    nbytes/len report the memory tier (the process footprint); `stats()` covers every tier.
    Call close() (or use `with`) to drain the write-behind queue and stop the threads.
    """

    def __init__(self, memory: MemoryLRUStore, lower: Sequence[KVStore] = (),
                 queue_size: int = 64, enqueue_timeout_s: float = 1.0,
                 prefetch_queue_size: int = 256):
        self.memory = memory
        self.lower = list(lower)
        self.enqueue_timeout_s = enqueue_timeout_s
        self._writes: queue.Queue = queue.Queue(maxsize=queue_size)
        self._prefetches: queue.Queue = queue.Queue(maxsize=prefetch_queue_size)
        self._pending: dict[ChunkKey, tuple[ChunkKV, int]] = {}  # key → (value, writes queued)
        self._lock = threading.Lock()
        self._flight: SingleFlight[ChunkKV] = SingleFlight()
        self.hits_by_tier = [0] * (1 + len(self.lower))
        self.pending_hits = self.misses = self.computes = 0
        self.dropped_writes = self.write_errors = self.dropped_prefetches = 0
        self._threads = [threading.Thread(target=self._write_loop, name="kv-write-behind",
                                          daemon=True),
                         threading.Thread(target=self._prefetch_loop, name="kv-prefetch",
                                          daemon=True)]
        self._closed = False
        for t in self._threads:
            t.start()

    # -- reads --------------------------------------------------------------------------------
    def get(self, key: ChunkKey) -> ChunkKV | None:
        """Value from the fastest tier that has a valid entry, promoted upward; None on a miss."""
        value = self.memory.get(key)
        if value is not None:
            with self._lock:
                self.hits_by_tier[0] += 1
            return value
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None:
                self.pending_hits += 1
                return pending[0]
        for depth, tier in enumerate(self.lower):
            value = tier.get(key)
            if value is not None:
                with self._lock:
                    self.hits_by_tier[depth + 1] += 1
                self.memory.put(key, value)
                if depth:
                    self._enqueue_write(key, value, self.lower[:depth])
                return value
        with self._lock:
            self.misses += 1
        return None

    def get_or_compute(self, key: ChunkKey, compute_fn: Callable[[], ChunkKV]) -> ChunkKV:
        """get(key), or compute_fn() stored with put() on a miss. Concurrent misses on one key
        run compute_fn once; the other callers wait and share its result (or its exception)."""
        def store(computed: ChunkKV) -> None:
            with self._lock:
                self.computes += 1
            self.put(key, computed)

        return get_or_compute(self._flight, key, lambda: self.get(key), lambda: self.get(key),
                              compute_fn, store)

    def contains(self, key: ChunkKey) -> bool:
        with self._lock:
            if key in self._pending:
                return True
        return self.memory.contains(key) or any(t.contains(key) for t in self.lower)

    # -- writes -------------------------------------------------------------------------------
    def put(self, key: ChunkKey, value: ChunkKV) -> None:
        """Stores in memory now and in every lower tier in the background."""
        self.memory.put(key, value)
        if self.lower:
            self._enqueue_write(key, value, self.lower)

    def _enqueue_write(self, key: ChunkKey, value: ChunkKV, tiers: Sequence[KVStore]) -> None:
        with self._lock:
            if self._closed:
                return
            _, queued = self._pending.get(key, (value, 0))
            self._pending[key] = (value, queued + 1)
        try:
            self._writes.put((key, value, tuple(tiers)), timeout=self.enqueue_timeout_s)
        except queue.Full:
            with self._lock:
                self.dropped_writes += 1
                self._release_pending(key)
            log.warning("write-behind queue full; lower-tier save of %s dropped", key)

    def _release_pending(self, key: ChunkKey) -> None:
        value, queued = self._pending[key]
        if queued <= 1:
            del self._pending[key]
        else:
            self._pending[key] = (value, queued - 1)

    def _write_loop(self) -> None:
        while (job := self._writes.get()) is not _STOP:
            key, value, tiers = job
            for tier in tiers:
                try:
                    tier.put(key, value)
                except Exception:  # a failing tier must not kill the writer
                    log.exception("write-behind to %s failed", type(tier).__name__)
                    with self._lock:
                        self.write_errors += 1
            with self._lock:
                self._release_pending(key)
            self._writes.task_done()
        self._writes.task_done()

    # -- scheduler hints ----------------------------------------------------------------------
    def prefetch(self, keys: Iterable[ChunkKey]) -> int:
        """Queues background promotion of `keys` (e.g. the chunks of queued requests) into the
        memory tier; returns how many were queued (keys already in memory are skipped; a full
        prefetch queue drops hints, counted in `dropped_prefetches`). Never blocks."""
        queued = 0
        for key in keys:
            if self.memory.contains(key):
                continue
            try:
                self._prefetches.put_nowait(key)
                queued += 1
            except queue.Full:
                with self._lock:
                    self.dropped_prefetches += 1
        return queued

    def _prefetch_loop(self) -> None:
        while (key := self._prefetches.get()) is not _STOP:
            try:
                if not self.memory.contains(key):
                    self.get(key)
            except Exception:
                log.exception("prefetch of %s failed", key)
            self._prefetches.task_done()
        self._prefetches.task_done()

    # -- lifecycle ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Blocks until every queued prefetch and lower-tier save has been attempted."""
        self._prefetches.join()
        self._writes.join()

    def close(self) -> None:
        """Flushes, then stops the background threads. Idempotent."""
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
        self._prefetches.put(_STOP)
        self._writes.put(_STOP)
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> "TieredStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- accounting ---------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return self.memory.nbytes

    def __len__(self) -> int:
        return len(self.memory)

    def __bool__(self) -> bool:  # a store is a store even when empty (`store or default`)
        return True

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {"hits_by_tier": list(self.hits_by_tier), "pending_hits": self.pending_hits,
                    "misses": self.misses, "computes": self.computes,
                    "dropped_writes": self.dropped_writes, "write_errors": self.write_errors,
                    "dropped_prefetches": self.dropped_prefetches,
                    "pending": len(self._pending),
                    "tier_bytes": [self.memory.nbytes] + [t.nbytes for t in self.lower]}

    def check_invariants(self) -> None:
        """Every tier's invariants, plus: every pending entry has at least one queued write."""
        self.memory.check_invariants()
        for tier in self.lower:
            tier.check_invariants()
        with self._lock:
            assert all(q >= 1 for _, q in self._pending.values()), "pending without a write"
