"""The store as the engine sees it: misses built behind the request, once per key, and counted
per chunk kind.

`StoreFront(inner)` is a KVStore over any store (tiered, partitioned, memory). What it adds:

- `build_behind(key, kind, compute)`: the engine hands every chunk miss here after answering.
  The chunk's KV is computed on a background thread and put into `inner`, so the answer never
  waits for it (write-back off the request path). One build per key at a time: a key already
  queued or being built is not queued again (`shared`), and `build_now` (the engine's
  `ensure_chunk`, e.g. catalog builds) joins an in-flight build of the same key through one
  `SingleFlight` instead of computing it a second time. The queue is bounded (`queue_size`):
  when full the build is dropped (`dropped`; the next request that misses the chunk queues it
  again), so memory does not grow with load.
- per chunk kind (item, history): hits counted at `get` (the kind derived from the value's
  token ids by the `KeyCheck` the engine attaches), misses counted when the engine reports
  them (`build_behind` / `count_miss`: a miss has no token ids, so its kind comes from the
  caller). `get` latency is the whole lookup's (every tier it went through).

- `run_behind(key, job)`: any other work after an answer, on the same thread and queue (the
  engine's exact user side, `reuse.user_side=behind`, which `job` stores in the user-prefix
  cache itself).

`nice`: the builder thread's niceness above its process's (the engine's `reuse.behind_nice`):
work behind the answers yields the cores to the request path and runs on what it leaves.

`flush()` waits for every queued build (the one-shot commands call it through `close()` before
exiting, so the next `rank` finds what this one built). Thread-safe. A compute function runs on
the builder thread concurrently with the caller's next request: it must not share mutable state
with it (the engine's `compute_chunk` runs a plain forward pass).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Callable

from .base import ChunkKey, ChunkKV, KVStore
from .codec import KeyCheck
from .latency import TierLatency, timed
from .singleflight import SingleFlight

log = logging.getLogger(__name__)
_STOP = object()
BUILD_COUNTERS = ("queued", "built", "shared", "dropped", "errors")


def lower_priority(nice: int) -> None:
    """Raises the calling thread's niceness by `nice` (Linux: setpriority on a thread id acts on
    that thread only), so its work yields the core to threads at the default priority."""
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class StoreFront:
    def __init__(self, inner: KVStore, queue_size: int = 256, check: KeyCheck | None = None,
                 nice: int = 0):
        self.inner = inner
        self.nice = nice
        self.check = check
        self.latency = TierLatency()
        self._flight: SingleFlight[bool] = SingleFlight()
        self._jobs: queue.Queue = queue.Queue(maxsize=queue_size)
        self._building: set[str] = set()     # queued or running build_behind/run_behind keys
        self._lock = threading.Lock()
        self.kind_hits: dict[str, int] = {}
        self.kind_misses: dict[str, int] = {}
        self.builds = dict.fromkeys(BUILD_COUNTERS, 0)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="kv-build-behind", daemon=True)
        self._thread.start()

    # ---- KVStore ------------------------------------------------------------------------------
    @timed("get")
    def get(self, key: ChunkKey) -> ChunkKV | None:
        value = self.inner.get(key)
        if value is not None:
            kind = self.check.kind_of(key, value.token_ids) if self.check else None
            base = KeyCheck.base_kind(kind) if kind else "unknown"
            with self._lock:
                self.kind_hits[base] = self.kind_hits.get(base, 0) + 1
        return value

    @timed("put")
    def put(self, key: ChunkKey, value: ChunkKV) -> None:
        self.inner.put(key, value)

    def contains(self, key: ChunkKey) -> bool:
        return self.inner.contains(key)

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def __len__(self) -> int:
        return len(self.inner)

    def __bool__(self) -> bool:  # a store is a store even when empty (`store or default`)
        return True

    # ---- misses -------------------------------------------------------------------------------
    def count_miss(self, kind: str) -> None:
        """Counts a request-path miss of a chunk of `kind` (`item@ctx` or `item`)."""
        base = KeyCheck.base_kind(kind)
        with self._lock:
            self.kind_misses[base] = self.kind_misses.get(base, 0) + 1

    def build_behind(self, key: ChunkKey, kind: str, compute: Callable[[], ChunkKV]) -> bool:
        """Counts the miss and queues `compute()` → put(key) on the builder thread, unless
        `key` is already queued or being built. Never blocks; True when queued."""
        self.count_miss(kind)
        if self.inner.contains(key):   # built since the request looked it up: nothing to do
            return False
        return self._enqueue(key, lambda: self.build_now(key, compute))

    def run_behind(self, key: str, job: Callable[[], None]) -> bool:
        """Queues other work after an answer on the builder thread — `job()` stores its result
        itself (the engine's exact user side goes to the user-prefix cache) — unless `key` is
        already queued or running; counted and bounded like a build. True when queued."""
        return self._enqueue(key, lambda: job() or True)

    def _enqueue(self, key: str, run: Callable[[], bool]) -> bool:
        with self._lock:
            if self._closed or key in self._building:
                self.builds["shared"] += not self._closed
                return False
            self._building.add(key)
        try:
            self._jobs.put_nowait((key, run))
        except queue.Full:
            with self._lock:
                self._building.discard(key)
                self.builds["dropped"] += 1
            return False
        with self._lock:
            self.builds["queued"] += 1
        return True

    def build_now(self, key: ChunkKey, compute: Callable[[], ChunkKV]) -> bool:
        """Computes and stores `key` unless present; a build of it in flight (behind or by
        another caller) is joined instead of repeated. True when this call built it."""
        return self._flight.do(key, lambda: self._build(key, compute))

    def _build(self, key: ChunkKey, compute: Callable[[], ChunkKV]) -> bool:
        if self.inner.contains(key):
            return False
        self.put(key, compute())
        return True

    def _loop(self) -> None:
        if self.nice:
            try:
                lower_priority(self.nice)
            except OSError as exc:  # a kernel without per-thread priorities: build anyway
                log.warning("builder thread left at the engine's priority (%s)", exc)
        while (job := self._jobs.get()) is not _STOP:
            key, run = job
            try:
                built = run()
                with self._lock:
                    self.builds["built"] += built
            except Exception:  # a failing build must not stop the builder
                log.exception("building %s behind the request failed", key)
                with self._lock:
                    self.builds["errors"] += 1
            finally:
                with self._lock:
                    self._building.discard(key)
                self._jobs.task_done()
        self._jobs.task_done()

    # ---- lifecycle ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Blocks until every queued build has run (then flushes `inner` if it can)."""
        self._jobs.join()
        flush = getattr(self.inner, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        """Runs the queued builds, then stops the builder thread (not `inner`). Idempotent."""
        with self._lock:
            if self._closed:
                return
        self._jobs.join()
        with self._lock:
            self._closed = True
        self._jobs.put(_STOP)
        self._thread.join(timeout=30)

    # ---- accounting ---------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Flat numbers for /metrics: `kind_hits:<kind>`, `kind_misses:<kind>`,
        `build_<counter>`, `build_queue` (builds waiting or running) and the get/put latency."""
        with self._lock:
            row: dict[str, float] = {f"kind_hits:{k}": n for k, n in self.kind_hits.items()}
            row.update({f"kind_misses:{k}": n for k, n in self.kind_misses.items()})
            row.update({f"build_{k}": n for k, n in self.builds.items()})
            row["build_queue"] = len(self._building)
        row.update(self.latency.row())
        return row

    def check_invariants(self) -> None:
        self.inner.check_invariants()
        with self._lock:
            assert len(self._building) <= self._jobs.maxsize + 1, "more builds than the queue"
            assert min(self.builds.values()) >= 0
