"""The chunk store an engine runs on: tiers put together, and entry checks for its real keys.

`build_store` makes memory (optionally split by chunk kind, so client-supplied reviews have
their own budget) → local disk → Redis (each optional), behind a `StoreFront` (misses built
behind the request, once per key; counters per chunk kind). `engine_key_check(engine)` is the `KeyCheck` of an
engine's fingerprint and every kind tag it keys chunks under (`item@<context>`,
`history@<context>` for each chunk context), and `attach_check` hands it to every tier that
validates entries. The engine is duck-typed here (this package sits below it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Mapping

from .base import ChunkKey, ChunkKV, InlineBuilds, KVStore, MemoryLRUStore
from .codec import KeyCheck
from .front import StoreFront

log = logging.getLogger(__name__)

ENGINE_CHUNK_KINDS = ("item", "history")          # the segment kinds the engine stores
CHUNK_CONTEXTS = ("template", "instruction", "none")
DEFAULT_DISK_BYTES = 8 << 30


def default_kv_dir(cache_root: str | os.PathLike) -> Path:
    """The persistent chunk store of the one-shot commands: `<cache root>/kv`."""
    return Path(cache_root) / "kv"


def engine_kinds(engine) -> tuple[str, ...]:
    """Every kind tag `engine` keys stored chunks under, for each chunk context a request may
    ask for (`reuse.chunk_context` is a per-request override)."""
    tags = [engine.chunks.kind_tag(kind, dataclasses.replace(engine.cfg.reuse,
                                                             chunk_context=mode))
            for kind in ENGINE_CHUNK_KINDS for mode in CHUNK_CONTEXTS]
    return tuple(dict.fromkeys(tags))


def engine_key_check(engine) -> KeyCheck:
    return KeyCheck(engine.loaded.fingerprint, engine_kinds(engine))


def memory_tiers(store) -> list[MemoryLRUStore]:
    """The process-memory stores inside `store`: what `EngineHost.keep_snapshot` saves and
    puts back. RcllmError when a tier lies outside the process (Redis, disk): its entries
    could not be put back as they were."""
    from ..errors import RcllmError
    from .tiered import TieredStore

    out = []
    for s in tiers(store):
        if isinstance(s, MemoryLRUStore):
            out.append(s)
        elif not isinstance(s, (StoreFront, PartitionedStore, TieredStore)):
            raise RcllmError(f"a snapshot of the store holds process memory only; this one has "
                             f"a {type(s).__name__} tier (serve without Redis and a KV folder)")
    return out


def tiers(store) -> list:
    """`store` and every store inside it (tiered, partitioned), outermost first."""
    out, todo = [], [store]
    while todo:
        s = todo.pop(0)
        out.append(s)
        if isinstance(s, StoreFront):
            todo.append(s.inner)
            continue
        todo += [getattr(s, "memory", None)] if hasattr(s, "memory") else []
        todo += list(getattr(s, "lower", ()))
        todo += list(getattr(s, "partitions", {}).values())
        if isinstance(s, PartitionedStore):
            todo.append(s.default)
    return [s for s in out if s is not None]


def attach_check(store, check: KeyCheck) -> int:
    """Gives `check` to every tier of `store` that validates entries; returns how many."""
    n = 0
    for s in tiers(store):
        if hasattr(s, "check"):
            s.check = check
            n += 1
    return n


TIER_COUNTERS = ("hits", "misses", "corrupt", "rejected", "evictions", "errors")
FRONT = "all"      # tier_stats' row of the StoreFront: the whole store as the engine sees it


def tier_stats(store) -> dict[str, dict[str, float]]:
    """Flat numbers of every leaf tier of `store`, by tier name (memory, memory-<kind> for a
    partitioned memory tier, disk, redis; a repeated name gets -<n>): its counters, bytes,
    entries, get/put latency histogram (`latency.TierLatency.row`) and, for the disk tier,
    `kind_{hits,puts,bytes}:<kind>`. A StoreFront adds the row `all` (`StoreFront.stats`:
    hits and misses per chunk kind, the build-behind counters, the whole lookup's latency; over
    a TieredStore also `write_pending`, the entries whose lower-tier writes are still queued)."""
    out: dict[str, dict[str, float]] = {}

    def add(name: str, tier) -> None:
        row: dict[str, float] = {c: int(getattr(tier, c)) for c in TIER_COUNTERS
                                 if hasattr(tier, c)}
        row["bytes"], row["entries"] = int(tier.nbytes), len(tier)
        if hasattr(tier, "latency"):
            row.update(tier.latency.row())
        for counter in ("hits", "puts", "bytes"):
            for kind, n in dict(getattr(tier, f"kind_{counter}", {})).items():
                row[f"kind_{counter}:{kind}"] = n
        key, n = name, 1
        while key in out:
            n += 1
            key = f"{name}-{n}"
        out[key] = row

    def walk(s, name: str) -> None:
        if isinstance(s, StoreFront):
            out[FRONT] = s.stats()
            walk(s.inner, name)
        elif isinstance(s, PartitionedStore):
            walk(s.default, name)
            for kind, part in s.partitions.items():
                walk(part, f"{name}-{kind}")
        elif hasattr(s, "memory") and hasattr(s, "lower"):     # TieredStore
            if FRONT in out:   # entries stored but not yet written to the lower tiers
                row = out[FRONT]
                row["write_pending"] = row.get("write_pending", 0) + s.stats()["pending"]
            walk(s.memory, "memory")
            for tier in s.lower:
                walk(tier, "disk" if hasattr(tier, "slot") else
                     "redis" if hasattr(tier, "client") else type(tier).__name__.lower())
        else:
            add(name, s)

    walk(store, "memory")
    return out


def close_store(store) -> None:
    """Runs queued builds (StoreFront), drains write-behind (TieredStore) and releases disk
    slots, outermost first; safe on any store."""
    for s in tiers(store):
        close = getattr(s, "close", None)
        if close is not None:
            close()


class PartitionedStore(InlineBuilds):
    """A store split by chunk kind, each part with its own byte budget: a put goes to the part
    of its kind (as the KeyCheck derives it from key + token ids; `default` when unknown), so
    one kind cannot evict another's entries. Client-supplied reviews (history chunks) in the
    server thus cannot push catalog item KV out of memory. Thread-safe if the parts are."""

    def __init__(self, default: KVStore, partitions: Mapping[str, KVStore],
                 check: KeyCheck | None = None):
        self.default = default
        self.partitions = dict(partitions)
        self.check = check

    def _parts(self) -> list[KVStore]:
        return [self.default, *self.partitions.values()]

    def part_for(self, key: ChunkKey, value: ChunkKV) -> KVStore:
        if self.check is None:
            return self.default
        kind = self.check.kind_of(key, value.token_ids)
        return self.partitions.get(KeyCheck.base_kind(kind), self.default) if kind else self.default

    def get(self, key: ChunkKey) -> ChunkKV | None:
        for part in self._parts():
            if part.contains(key):
                value = part.get(key)
                if value is not None:
                    return value
        return None

    def put(self, key: ChunkKey, value: ChunkKV) -> None:
        self.part_for(key, value).put(key, value)

    def contains(self, key: ChunkKey) -> bool:
        return any(p.contains(key) for p in self._parts())

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._parts())

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts())

    def __bool__(self) -> bool:  # a store is a store even when empty (`store or default`)
        return True

    def check_invariants(self) -> None:
        for p in self._parts():
            p.check_invariants()


def parse_redis_url(url: str) -> tuple[str, int]:
    """(host, port) of `redis://host[:port]`; anything else is refused with an RcllmError."""
    from urllib.parse import urlsplit

    from ..errors import RcllmError

    parts = urlsplit(url)
    try:
        port = parts.port or 6379
    except ValueError:
        port = -1
    if parts.scheme != "redis" or not parts.hostname or port < 1 or parts.username \
            or parts.password or parts.path not in ("", "/", "/0") or parts.query:
        raise RcllmError(f"--redis {url!r}: give redis://HOST[:PORT] (database 0, no "
                         f"password: the Redis tier is for a private, trusted server)")
    return parts.hostname, port


def build_store(memory_bytes: int, kv_dir: str | os.PathLike | None = None,
                disk_bytes: int = DEFAULT_DISK_BYTES, history_bytes: int | None = None,
                encoding: str = "raw", redis_url: str | None = None,
                behind_nice: int = 0) -> KVStore:
    """Memory (with a separate `history_bytes` budget for review chunks when given), then a
    DiskStore at `kv_dir`, then Redis at `redis_url`, each when given, behind read-through and
    write-behind (TieredStore), all behind a StoreFront (build-behind with singleflight, counts
    per chunk kind; its builder thread at niceness `behind_nice`). `encoding` ("raw" | "int8")
    applies to disk and Redis. Attach the engine's
    KeyCheck once the engine exists (`attach_check(store, engine_key_check(engine))`)."""
    memory: KVStore = MemoryLRUStore(memory_bytes)
    if history_bytes is not None:
        memory = PartitionedStore(memory, {"history": MemoryLRUStore(history_bytes)})
    lower: list[KVStore] = []
    if kv_dir is not None:
        from .disk import DiskStore

        lower.append(DiskStore(kv_dir, disk_bytes, encoding=encoding))
    if redis_url:
        from .redis_store import RedisStore

        host, port = parse_redis_url(redis_url)
        lower.append(RedisStore(host, port, encoding=encoding))
    inner = memory
    if lower:
        from .tiered import TieredStore

        inner = TieredStore(memory, lower)
    return StoreFront(inner, nice=behind_nice)
