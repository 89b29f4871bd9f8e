"""Which labelled entries a store holds, kept up to date by the store's own puts and drops.

A serving instance answers "which catalog items does my store hold?" for its router, and must
say which it lost after an eviction. Scanning for it costs a content key (a hash of the item's
token ids) and a look-up per catalog item under the engine lock (about 11 µs an item, issue
51), and at a catalog larger than memory that was paid on every eviction. `HeldIndex` instead
watches the tiers (`base.WatchedKeys`): each put of a new key and each drop is one O(1)
update, so the answer costs O(held) and the losses since the last call O(lost), with no key
hashed again.

Labels are the caller's names for keys (an item id for its chunk's key): `label(name, key)`
(re-labelling an updated item moves it to its new key), `unlabel(name)`. A key counts as held
while any watched tier holds it (memory or the disk below it), so an entry that moves from
memory to disk is not lost. Only the tiers' own entries count: another process's slot of a
shared disk folder can vanish at that process's will.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Sequence

from .base import ChunkKey, WatchedKeys


class HeldIndex:
    """Thread-safe; its lock is taken inside the tiers' locks (it never calls a tier after
    `__init__`, which reads what each tier holds once)."""

    def __init__(self, tiers: Sequence[WatchedKeys]) -> None:
        self._lock = threading.Lock()
        self._tiers = list(tiers)
        self._count: dict[ChunkKey, int] = {}    # every key a watched tier holds → how many
        self._labels_of: dict[ChunkKey, set[str]] = {}   # two items may share one chunk
        self._key_of: dict[str, ChunkKey] = {}
        self._held: set[str] = set()             # labels whose key is in `_count`
        self._lost: set[str] = set()             # labels that stopped being held, not yet taken
        for tier in self._tiers:
            tier.watch(self)

    # ---- the tiers' reports (KeyWatcher) ------------------------------------------------------
    def added(self, key: ChunkKey) -> None:
        with self._lock:
            self._count[key] = self._count.get(key, 0) + 1
            self._held.update(self._labels_of.get(key, ()))

    def removed(self, key: ChunkKey) -> None:
        with self._lock:
            n = self._count.get(key, 0) - 1
            if n > 0:
                self._count[key] = n
                return
            self._count.pop(key, None)
            labels = self._labels_of.get(key, ())
            self._held.difference_update(labels)
            self._lost.update(labels)

    # ---- labels -------------------------------------------------------------------------------
    def label(self, name: str, key: ChunkKey) -> None:
        """`name`'s entry is the one under `key` from now on (its earlier key, if any, no
        longer counts for it). Names may share a key (two items with the same chunk text)."""
        with self._lock:
            self._unlabel_locked(name)
            self._key_of[name] = key
            self._labels_of.setdefault(key, set()).add(name)
            if key in self._count:
                self._held.add(name)
                self._lost.discard(name)

    def unlabel(self, name: str) -> None:
        with self._lock:
            self._unlabel_locked(name)

    def _unlabel_locked(self, name: str) -> None:
        key = self._key_of.pop(name, None)
        if key is not None:
            names = self._labels_of[key]
            names.discard(name)
            if not names:
                del self._labels_of[key]
            if name in self._held:
                self._held.discard(name)
                self._lost.add(name)

    # ---- answers ------------------------------------------------------------------------------
    def held(self) -> list[str]:
        """The labels whose entry a watched tier holds now. O(held)."""
        with self._lock:
            return list(self._held)

    def take_lost(self) -> list[str]:
        """The labels that stopped being held since the last call and are not held again now
        (each reported once). O(lost)."""
        with self._lock:
            lost = [name for name in self._lost if name not in self._held]
            self._lost.clear()
            return lost

    def check_invariants(self) -> None:
        """The index equals a scan: its keys are the tiers' own keys (counted per tier), and a
        label is held exactly when its key is among them. O(entries): for tests. The tiers'
        locks are taken before the index's, in the order their reports take them."""
        with ExitStack() as held_still:
            for tier in self._tiers:
                held_still.enter_context(tier._lock)
            held_still.enter_context(self._lock)
            scan: dict[ChunkKey, int] = {}
            for tier in self._tiers:
                for key in tier._own_keys():
                    scan[key] = scan.get(key, 0) + 1
            assert scan == self._count, "index keys differ from the tiers' own keys"
            held = {name for name, key in self._key_of.items() if key in scan}
            assert held == self._held, "held labels differ from a scan"
            assert {(n, k) for k, names in self._labels_of.items() for n in names} \
                == set(self._key_of.items()), "labels and keys disagree"
