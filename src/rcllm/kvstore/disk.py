"""Local-disk tier: one safetensors file per entry, an in-memory LRU index, a byte budget.

Layout: root/<2 hex>/<blake2b(key)>.safetensors (the file name is a hash so any key string is a
safe name; the real key is inside the entry and checked on read). Writes go to a temp file and
are renamed into place, so a reader never sees half an entry; a crash leaves at most a stray
*.tmp file, removed on the next open. On open, existing entries are re-indexed (header only)
in mtime order, oldest first = least recently used.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from .base import ChunkKey, ChunkKV
from .codec import InvalidEntry, KeyCheck, decode, encode_checked, read_metadata

log = logging.getLogger(__name__)
SUFFIX = ".safetensors"


class DiskStore:
    """KVStore on local files, LRU by bytes. Thread-safe.

    get() returns None on a miss or on an invalid entry (which is deleted and counted in
    `corrupt`); put() refuses entries whose key the KeyCheck cannot re-derive (`rejected`) or
    that exceed the budget, and evicts least-recently-used files to stay within capacity_bytes.
    encoding="int8" stores lossy per-channel INT8 (see int8.py).
    """

    def __init__(self, root: str | os.PathLike, capacity_bytes: int = 64 << 30,
                 check: KeyCheck | None = None, encoding: str = "raw"):
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.check = check
        self.encoding = encoding
        self._index: OrderedDict[ChunkKey, int] = OrderedDict()  # key → file bytes, LRU first
        self._nbytes = 0
        self._lock = threading.Lock()
        self._tmp_ids = itertools.count()
        self.hits = self.misses = self.evictions = self.corrupt = self.rejected = 0
        self.root.mkdir(parents=True, exist_ok=True)
        self._reindex()

    def _path(self, key: ChunkKey) -> Path:
        name = hashlib.blake2b(key.encode(), digest_size=20).hexdigest()
        return self.root / name[:2] / (name + SUFFIX)

    def _reindex(self) -> None:
        found = []
        for path in self.root.glob("*/*"):
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            try:
                with open(path, "rb") as fh:
                    head = fh.read(8)
                    length = int.from_bytes(head, "little")
                    meta = read_metadata(head + fh.read(min(length, 1 << 20)))
                if self._path(meta["key"]) != path:
                    raise InvalidEntry("file name does not match its key")
                found.append((path.stat().st_mtime_ns, meta["key"], path.stat().st_size))
            except (OSError, InvalidEntry) as exc:
                log.warning("dropping unreadable KV file %s: %s", path, exc)
                path.unlink(missing_ok=True)
        for _, key, size in sorted(found):
            self._index[ChunkKey(key)] = size
            self._nbytes += size
        self._evict_locked(0)

    def _drop_locked(self, key: ChunkKey) -> None:
        size = self._index.pop(key, None)
        if size is not None:
            self._nbytes -= size
        self._path(key).unlink(missing_ok=True)

    def _evict_locked(self, incoming_bytes: int) -> None:
        while self._index and self._nbytes + incoming_bytes > self.capacity_bytes:
            key = next(iter(self._index))
            self._drop_locked(key)
            self.evictions += 1

    def get(self, key: ChunkKey) -> ChunkKV | None:
        with self._lock:
            if key not in self._index:
                self.misses += 1
                return None
            self._index.move_to_end(key)
            path = self._path(key)
        try:
            data = path.read_bytes()
            value = decode(data, key, self.check)
        except FileNotFoundError:  # evicted or replaced between index lookup and read
            with self._lock:
                self.misses += 1
            return None
        except (OSError, InvalidEntry) as exc:
            log.warning("dropping invalid KV entry %s: %s", key, exc)
            with self._lock:
                self._drop_locked(key)
                self.corrupt += 1
                self.misses += 1
            return None
        with self._lock:
            self.hits += 1
        return value

    def put(self, key: ChunkKey, value: ChunkKV) -> None:
        data = encode_checked(key, value, self.encoding, self.check)
        if data is None:
            with self._lock:
                self.rejected += 1
            log.warning("refusing KV entry %s: key does not match its token ids", key)
            return
        if len(data) > self.capacity_bytes:
            return
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{next(self._tmp_ids)}.tmp")
        tmp.write_bytes(data)
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self._nbytes -= old
            self._evict_locked(len(data))
            os.replace(tmp, path)
            self._index[key] = len(data)
            self._nbytes += len(data)

    def contains(self, key: ChunkKey) -> bool:
        with self._lock:
            return key in self._index

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._index)

    def check_invariants(self) -> None:
        """Index bytes = sum of entries = sizes on disk; within budget; no unindexed files."""
        with self._lock:
            assert sum(self._index.values()) == self._nbytes, "byte accounting off"
            assert self._nbytes <= self.capacity_bytes, "disk tier over its byte budget"
            paths = {self._path(k): size for k, size in self._index.items()}
            for path, size in paths.items():
                assert path.stat().st_size == size, f"{path} size differs from the index"
            on_disk = {p for p in self.root.glob("*/*") if p.name.endswith(SUFFIX)}
            assert on_disk == set(paths), "files on disk differ from the index"
