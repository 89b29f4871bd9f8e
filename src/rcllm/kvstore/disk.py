"""Local-disk tier: one entry file per chunk, an in-memory LRU index, a byte budget.

The store touches only files it created. Layout:

    root/rcllm-kvstore.json                 marker: this folder is an rcllm KV store
    root/slot-<n>/.lock                      held (flock) by the one live store writing slot n
    root/slot-<n>/<2 hex>/<40 hex>.rckv      one entry (name = blake2b(key); the key is inside)

A folder is opened only when it is new, empty, or carries the marker; any other folder (say
`--kv-dir ~`) is refused with an RcllmError, and nothing is ever written into it. Inside a
marked folder only names of the patterns above are written, read or deleted; any other file is
left alone.

Several processes may share one folder: each store takes the first free *slot* (an exclusive
flock on its `.lock`, released by the OS when the process dies), and writes, evicts and
deletes only within its slot, so two instances never delete each other's files. Entries of the
other slots are read (validated like its own) but never deleted: a corrupt foreign entry is a
counted miss and is remembered as bad. A later process takes over a free slot with its files
(a second `rcllm rank` reuses what the first one built).

Writes go to a temp file in the slot and are renamed into place, so a reader never sees half an
entry; a crash leaves at most a stray temp file, removed by the next holder of that slot. On
open, the slot's entries are re-indexed (header only) in mtime order, oldest first = least
recently used; unreadable entries of the slot are deleted (counted in `corrupt`).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

from ..errors import RcllmError
from .base import ChunkKey, ChunkKV, InlineBuilds, WatchedKeys
from .codec import InvalidEntry, KeyCheck, decode, encode_checked, read_metadata
from .latency import TierLatency, timed

log = logging.getLogger(__name__)
SUFFIX = ".rckv"
MARKER = "rcllm-kvstore.json"
MARKER_FORMAT = "rcllm-kv-dir/1"
LOCK = ".lock"
MAX_SLOTS = 64
_SLOT = re.compile(r"slot-(\d+)")
_SHARD = re.compile(r"[0-9a-f]{2}")
_ENTRY = re.compile(r"[0-9a-f]{40}" + re.escape(SUFFIX))
_TMP = re.compile(r"[0-9a-f]{40}" + re.escape(SUFFIX) + r"\.\d+\.\d+\.tmp")


def is_store_folder(root: str | os.PathLike) -> bool:
    """True when `root` carries the marker of an rcllm KV store."""
    try:
        return json.loads((Path(root) / MARKER).read_text()).get("format") == MARKER_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def claim_folder(root: Path) -> None:
    """Makes `root` a marked KV store folder, or refuses one that holds anything else."""
    if root.exists() and not root.is_dir():
        raise RcllmError(f"KV store {root} is not a folder")
    if is_store_folder(root):
        return
    if root.exists() and any(root.iterdir()):
        raise RcllmError(
            f"{root} is not empty and not an rcllm KV store (no {MARKER}); give a new or empty "
            f"folder: rcllm only writes into, and deletes from, folders it created. (A folder "
            f"written by an rcllm before the marker existed can be removed with rm -r.)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{MARKER}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"format": MARKER_FORMAT,
                                   "about": "rcllm chunk KV store; safe to delete as a whole"}))
        os.replace(tmp, root / MARKER)
    except OSError as exc:
        raise RcllmError(f"cannot create KV store {root}: {exc.strerror or exc}") from None


class DiskStore(WatchedKeys, InlineBuilds):
    """KVStore on local files, LRU by bytes. Thread-safe.

    get() returns None on a miss or on an invalid entry (which is deleted when it is in this
    store's slot, and counted in `corrupt` either way); put() refuses entries whose key the
    KeyCheck cannot re-derive (`rejected`) or that exceed the budget, and evicts
    least-recently-used files of its own slot to stay within capacity_bytes (the budget is per
    slot, i.e. per process sharing the folder). encoding="int8" stores lossy per-channel INT8.
    """

    def __init__(self, root: str | os.PathLike, capacity_bytes: int = 64 << 30,
                 check: KeyCheck | None = None, encoding: str = "raw"):
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.root = Path(root).expanduser()
        self.capacity_bytes = capacity_bytes
        self.check = check
        self.encoding = encoding
        self._index: OrderedDict[ChunkKey, int] = OrderedDict()  # key → file bytes, LRU first
        self._nbytes = 0
        self._lock = threading.Lock()
        self._tmp_ids = itertools.count()
        self._bad: set[Path] = set()        # foreign entries found invalid (never deleted)
        self.hits = self.misses = self.evictions = self.corrupt = self.rejected = 0
        self.foreign_hits = 0
        self.latency = TierLatency()
        # by base kind (item, history): a miss has no token ids, so misses are not split
        self._kinds: dict[ChunkKey, str] = {}              # own entries' base kind
        self.kind_hits: dict[str, int] = {}
        self.kind_puts: dict[str, int] = {}
        self.kind_bytes: dict[str, int] = {}
        claim_folder(self.root)
        self.slot, self._lock_fd = self._claim_slot()
        self._reindex()

    # ---- slots ------------------------------------------------------------------------------
    def _claim_slot(self) -> tuple[Path, int]:
        for n in range(MAX_SLOTS):
            slot = self.root / f"slot-{n}"
            try:
                slot.mkdir(exist_ok=True)
                fd = os.open(slot / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise RcllmError(f"cannot use KV store {self.root}: {exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            return slot, fd
        raise RcllmError(f"KV store {self.root}: all {MAX_SLOTS} slots are in use")

    def _other_slots(self) -> list[Path]:
        try:
            return [p for p in self.root.iterdir()
                    if _SLOT.fullmatch(p.name) and p != self.slot and p.is_dir()]
        except OSError:
            return []

    def close(self) -> None:
        """Releases this store's slot (another store may then take it over). Idempotent."""
        with self._lock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)   # closing the descriptor drops the flock
                self._lock_fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ---- files ------------------------------------------------------------------------------
    @staticmethod
    def _name(key: ChunkKey) -> str:
        return hashlib.blake2b(key.encode(), digest_size=20).hexdigest()

    def _path(self, key: ChunkKey, slot: Path | None = None) -> Path:
        name = self._name(key)
        return (slot or self.slot) / name[:2] / (name + SUFFIX)

    def _own_files(self):
        """(path, is_temp) of every file in this slot whose name this store writes."""
        for shard in self.slot.iterdir():
            if not (shard.is_dir() and _SHARD.fullmatch(shard.name)):
                continue
            for path in shard.iterdir():
                if _ENTRY.fullmatch(path.name):
                    yield path, False
                elif _TMP.fullmatch(path.name):
                    yield path, True

    def _reindex(self) -> None:
        found = []
        for path, temp in self._own_files():
            if temp:  # the slot is ours: a temp file is a crashed writer's leftover
                path.unlink(missing_ok=True)
                continue
            try:
                with open(path, "rb") as fh:
                    head = fh.read(8)
                    length = int.from_bytes(head, "little")
                    meta = read_metadata(head + fh.read(min(length, 1 << 20)))
                if self._path(meta["key"]) != path:
                    raise InvalidEntry("file name does not match its key")
                st = path.stat()
                found.append((st.st_mtime_ns, meta["key"], st.st_size, meta.get("kind", "")))
            except (OSError, InvalidEntry) as exc:
                log.warning("dropping unreadable KV file %s: %s", path, exc)
                self.corrupt += 1
                path.unlink(missing_ok=True)
        for _, key, size, kind in sorted(found):
            self._index[ChunkKey(key)] = size
            self._nbytes += size
            self._count_bytes(ChunkKey(key), kind, size)
        self._evict_locked(0)

    def _count_bytes(self, key: ChunkKey, kind: str, size: int) -> None:
        base = KeyCheck.base_kind(kind) or "unknown"
        self._kinds[key] = base
        self.kind_bytes[base] = self.kind_bytes.get(base, 0) + size

    def _count_hit(self, kind: str | None) -> None:
        base = KeyCheck.base_kind(kind or "") or "unknown"
        self.kind_hits[base] = self.kind_hits.get(base, 0) + 1

    def _drop_locked(self, key: ChunkKey) -> None:
        if self._drop_locked_index(key):
            self._removed(key)
        self._path(key).unlink(missing_ok=True)

    def _drop_locked_index(self, key: ChunkKey) -> bool:
        """Forgets `key`'s accounting (its file is about to be replaced or removed); whether
        it was indexed."""
        size = self._index.pop(key, None)
        if size is not None:
            self._nbytes -= size
            base = self._kinds.pop(key, "unknown")
            self.kind_bytes[base] = self.kind_bytes.get(base, 0) - size
        return size is not None

    def _evict_locked(self, incoming_bytes: int) -> None:
        while self._index and self._nbytes + incoming_bytes > self.capacity_bytes:
            key = next(iter(self._index))
            self._drop_locked(key)
            self.evictions += 1

    # ---- KVStore ----------------------------------------------------------------------------
    @timed("get")
    def get(self, key: ChunkKey) -> ChunkKV | None:
        with self._lock:
            own = key in self._index
            if own:
                self._index.move_to_end(key)
        if not own:
            return self._get_foreign(key)
        path = self._path(key)
        try:
            value = decode(path.read_bytes(), key, self.check)
        except FileNotFoundError:  # removed by hand since it was indexed
            with self._lock:
                self._drop_locked(key)
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
            self._count_hit(self._kinds.get(key))
        return value

    def _get_foreign(self, key: ChunkKey) -> ChunkKV | None:
        """The entry another slot (another process sharing the folder) holds, read only."""
        for slot in self._other_slots():
            path = self._path(key, slot)
            if path in self._bad:
                continue
            try:
                data = path.read_bytes()
            except OSError:   # absent in that slot (or evicted meanwhile)
                continue
            try:
                value = decode(data, key, self.check)
            except InvalidEntry as exc:
                log.warning("ignoring invalid KV entry %s of %s: %s", key, slot.name, exc)
                with self._lock:
                    self._bad.add(path)
                    self.corrupt += 1
                continue
            with self._lock:
                self.hits += 1
                self.foreign_hits += 1
                self._count_hit(read_metadata(data).get("kind"))
            return value
        with self._lock:
            self.misses += 1
        return None

    @timed("put")
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
        try:
            tmp.write_bytes(data)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        kind = read_metadata(data).get("kind", "")
        with self._lock:
            fresh = not self._drop_locked_index(key)
            self._evict_locked(len(data))
            os.replace(tmp, path)
            self._index[key] = len(data)
            if fresh:
                self._added(key)
            self._nbytes += len(data)
            self._count_bytes(key, kind, len(data))
            base = self._kinds[key]
            self.kind_puts[base] = self.kind_puts.get(base, 0) + 1

    def contains(self, key: ChunkKey) -> bool:
        with self._lock:
            if key in self._index:
                return True
        return any(p not in self._bad and p.is_file()
                   for p in (self._path(key, s) for s in self._other_slots()))

    def _own_keys(self):
        """This slot's entries (another process's slot of a shared folder is its own)."""
        return self._index.keys()

    @property
    def nbytes(self) -> int:
        """Bytes of this store's own slot."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._index)

    def __bool__(self) -> bool:  # a store is a store even when empty (`store or default`)
        return True

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "foreign_hits": self.foreign_hits,
                    "evictions": self.evictions, "corrupt": self.corrupt,
                    "rejected": self.rejected, "bytes": self._nbytes,
                    "entries": len(self._index)}

    def check_invariants(self) -> None:
        """Index bytes = sum of entries = sizes on disk; within budget; no unindexed files."""
        with self._lock:
            assert sum(self._index.values()) == self._nbytes, "byte accounting off"
            assert sum(self.kind_bytes.values()) == self._nbytes, "per-kind bytes off"
            assert set(self._kinds) == set(self._index), "per-kind index off"
            assert self._nbytes <= self.capacity_bytes, "disk tier over its byte budget"
            paths = {self._path(k): size for k, size in self._index.items()}
            for path, size in paths.items():
                assert path.stat().st_size == size, f"{path} size differs from the index"
            on_disk = {p for p, temp in self._own_files() if not temp}
            assert on_disk == set(paths), "files on disk differ from the index"
