"""Position-independent KV chunks, their content keys, and the store interface.

A chunk's keys are stored *before* RoPE, so the same entry serves the chunk at any position:
the prefill rotates them to wherever the chunk lands in a prompt. The key of an entry is a hash
of (model fingerprint, chunk kind, token ids): a model update (new fingerprint) can never be
served stale KV, and the same text at another position hits the same entry.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, NewType, Protocol, Sequence

import torch

from .latency import TierLatency, timed

ChunkKey = NewType("ChunkKey", str)


def chunk_key(fingerprint: str, kind: str, token_ids: Sequence[int]) -> ChunkKey:
    h = hashlib.sha256()
    h.update(fingerprint.encode())
    h.update(b"\0" + kind.encode() + b"\0")
    h.update(",".join(map(str, token_ids)).encode())
    return ChunkKey(h.hexdigest())


@dataclass(frozen=True)
class ChunkKV:
    """KV of one chunk for every layer.

    k, v: [L, H_kv, T, D]; k is pre-RoPE (after q/k-norm where the model has it).
    token_ids: the T token ids the KV was computed from (checked on use).
    states: [T, d] or None: the hidden states entering layer `states_layer` in the pass that
    built the KV (an item built for `late`: its tokens start there in a prompt), travelling
    with the KV through every tier, so an instance that fetches the chunk does not rerun its
    lower layers (~2.3 KB a token beside ~46 KB of KV for SmolLM2-135M in fp32).
    """

    token_ids: tuple[int, ...]
    k: torch.Tensor
    v: torch.Tensor
    states: torch.Tensor | None = None
    states_layer: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        h = 0 if self.states is None else self.states.numel() * self.states.element_size()
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size() + h

    def states_at(self, layer: int) -> torch.Tensor | None:
        """The states entering `layer` when this entry carries them, else None."""
        return self.states if self.states is not None and self.states_layer == layer else None


@dataclass(frozen=True)
class KVMatch:
    """One cache's answer for a run of prompt slots: the one look-up shape of every cache the
    engine reads (the prefix cache, the user side, the chunk store, the prototype library), so
    the engine assembles a prompt's KV without knowing any cache's internals.

    The match covers slots [start, start + length). Its K/V arrive in `pieces` (offset from
    `start`, k, v) with k, v [L, H_kv, n, D] and keys pre-RoPE; the caller copies them in and
    must not modify them. `held` says which covered slots hold usable KV: the first `held`
    slots (an int; an item chunk's fresh tail is not held), or a bool mask [length]. `exact`:
    computed at these very positions after this very prefix (never recomputed); else reused
    KV that selective recomputation may refresh."""

    source: str                  # "prefix" | "user_prefix" | "chunk" | "prototype"
    start: int
    length: int
    pieces: tuple[tuple[int, torch.Tensor, torch.Tensor], ...]
    held: "int | torch.Tensor"
    exact: bool = False
    entry: "ChunkKV | None" = None   # the chunk store's entry (its `states`), for `late`

    def at(self, start: int) -> "KVMatch":
        """The same match placed at slot `start` (a position-independent chunk lands anywhere)."""
        return KVMatch(self.source, start, self.length, self.pieces, self.held, self.exact,
                       self.entry)

    def copies(self):
        """(first slot, end slot, k, v) of each piece, in prompt slots."""
        for off, k, v in self.pieces:
            s = self.start + off
            yield s, s + k.shape[2], k, v

    def held_mask(self) -> torch.Tensor:
        """[length] bool: the covered slots that hold usable KV."""
        if isinstance(self.held, int):
            return torch.arange(self.length) < self.held
        return self.held.cpu()


def match_chunk(store: "KVStore", key: ChunkKey, token_ids: Sequence[int],
                fresh_tail: int = 0) -> KVMatch | None:
    """The chunk store's look-up: the entry under `key` as a match at slot 0 (place it with
    `at`), or None on a miss or when the entry holds other tokens (a hash collision is never
    served). `fresh_tail` last slots are left unheld (computed in the prompt)."""
    entry = store.get(key)
    if entry is None or entry.token_ids != tuple(token_ids):
        return None
    n = len(token_ids)
    return KVMatch("chunk", 0, n, ((0, entry.k, entry.v),), max(0, n - fresh_tail),
                   entry=entry)


class KVStore(Protocol):
    """What the engine needs from any store or tier.

    get() returns None on a miss (never raises for a missing key); put() may evict other
    entries to stay within the store's byte budget; an entry larger than the budget is not
    stored. Entries are immutable once stored: callers must not modify returned tensors.

    Builds (the engine's misses): `build_now` computes and stores a key unless present (True
    when this call built it); `build_behind` counts a request-path miss of `kind` and builds
    the key after the answer; `run_behind` runs other after-the-answer work (`job` stores its
    own result) keyed by `key`; `count_miss` counts a miss that is not built. `InlineBuilds`
    gives a plain store these operations done at once in the caller's thread; the store front
    (`kvstore.front.StoreFront`) queues the behind ones on its builder thread instead.
    """

    def get(self, key: ChunkKey) -> ChunkKV | None: ...
    def put(self, key: ChunkKey, value: ChunkKV) -> None: ...
    def contains(self, key: ChunkKey) -> bool: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    def check_invariants(self) -> None: ...
    def build_now(self, key: ChunkKey, compute: Callable[[], ChunkKV]) -> bool: ...
    def build_behind(self, key: ChunkKey, kind: str, compute: Callable[[], ChunkKV]) -> bool: ...
    def run_behind(self, key: str, job: Callable[[], None]) -> bool: ...
    def count_miss(self, kind: str) -> None: ...


class InlineBuilds:
    """The `KVStore` build operations for a store with no builder thread: everything runs now,
    in the caller's thread (off the request's clock: the engine calls them after answering).
    Misses are not counted (a plain store keeps no per-kind counters)."""

    def build_now(self, key: ChunkKey, compute: Callable[[], ChunkKV]) -> bool:
        if self.contains(key):
            return False
        self.put(key, compute())
        return True

    def build_behind(self, key: ChunkKey, kind: str, compute: Callable[[], ChunkKV]) -> bool:
        return self.build_now(key, compute)

    def run_behind(self, key: str, job: Callable[[], None]) -> bool:
        job()
        return True

    def count_miss(self, kind: str) -> None:
        return None


class KeyWatcher(Protocol):
    """Told of a tier's own entries as they come and go, so that its owner keeps an index of
    what the tier holds without scanning the tier's keys. `added(key)`: the tier now holds
    `key` (it did not before); `removed(key)`: it no longer does (evicted, or dropped as
    invalid). Called in the thread that changed the entry, under the tier's lock: it must be
    quick and must not call back into the store."""

    def added(self, key: ChunkKey) -> None: ...
    def removed(self, key: ChunkKey) -> None: ...


class WatchedKeys:
    """A tier that reports its own entries to watchers (`KeyWatcher`). The tier supplies
    `_lock` and `_own_keys()` and calls `_added` / `_removed` under its lock, once per key
    that enters or leaves it (a put over a held key is neither)."""

    _watchers: tuple = ()

    def watch(self, watcher: KeyWatcher) -> None:
        """Reports every entry held now to `watcher.added` (once, O(entries)), then every later
        put of a new key and every drop (O(1) each)."""
        with self._lock:
            for key in self._own_keys():
                watcher.added(key)
            self._watchers = (*self._watchers, watcher)

    def _added(self, key: ChunkKey) -> None:
        for w in self._watchers:
            w.added(key)

    def _removed(self, key: ChunkKey) -> None:
        for w in self._watchers:
            w.removed(key)


class MemoryLRUStore(WatchedKeys, InlineBuilds):
    """Process-memory store, least-recently-used eviction by bytes. Thread-safe. Eviction pops
    the least recent entries off the ordered map: O(evicted), never a scan of the keys."""

    def __init__(self, capacity_bytes: int = 8 << 30):
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[ChunkKey, ChunkKV] = OrderedDict()
        self._nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.latency = TierLatency()

    @timed("get")
    def get(self, key: ChunkKey) -> ChunkKV | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    @timed("put")
    def put(self, key: ChunkKey, value: ChunkKV) -> None:
        size = value.nbytes
        if size > self.capacity_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old.nbytes
            while self._entries and self._nbytes + size > self.capacity_bytes:
                gone, evicted = self._entries.popitem(last=False)
                self._nbytes -= evicted.nbytes
                self.evictions += 1
                self._removed(gone)
            self._entries[key] = value
            self._nbytes += size
            if old is None:
                self._added(key)

    def contains(self, key: ChunkKey) -> bool:
        with self._lock:
            return key in self._entries

    def snapshot(self) -> list[tuple[ChunkKey, ChunkKV]]:
        """The entries now, least recent first (references: entries are never modified)."""
        with self._lock:
            return list(self._entries.items())

    def restore(self, entries: list[tuple[ChunkKey, ChunkKV]]) -> None:
        """Holds exactly `entries` (a `snapshot`), in their recency order; watchers hear of
        every key that leaves or comes back, as puts and evictions report them."""
        with self._lock:
            wanted = OrderedDict(entries)
            for key in [k for k in self._entries if k not in wanted]:
                del self._entries[key]
                self._removed(key)
            for key in wanted:
                if key not in self._entries:
                    self._added(key)
            self._entries = wanted
            self._nbytes = sum(e.nbytes for e in wanted.values())

    def _own_keys(self):
        return self._entries.keys()

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:  # a store is a store even when empty (`store or default`)
        return True

    def check_invariants(self) -> None:
        with self._lock:
            total = sum(e.nbytes for e in self._entries.values())
            assert total == self._nbytes, f"byte accounting off: {total} != {self._nbytes}"
            assert self._nbytes <= self.capacity_bytes, "store over its byte budget"
