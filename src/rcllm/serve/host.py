"""One engine with a mutable catalog: ranking, and item updates built off the request path.

Contract: every engine call holds `lock` (the engine is not thread-safe). An item update is
built first (its chunk KV computed and stored), then swapped into the catalog in one step
under the lock, so a request sees either the old item or the new one with its KV, never a
half-built entry. Updates of one id are versioned: the latest PUT or DELETE wins, an older
build finishing later is dropped. Versions come from one counter for all ids, so an id's entry
in the version map is dropped once nothing is pending for it: the map holds only ids with
builds in flight, whatever the number of ids ever PUT or DELETEd.
"""

from __future__ import annotations

import logging
import itertools
import queue
import threading
import time
from typing import Any

from ..engine import Engine
from ..kvstore.base import ChunkKV
from ..errors import RcllmError
from ..prompt.builder import PromptBuilder, RankRequest
from ..records import HistoryEntry, Item, ItemId
from .worker import Overloaded

log = logging.getLogger(__name__)
MAX_PENDING_BUILDS = 4096


def history_of(payload: dict[str, Any]) -> tuple[HistoryEntry, ...]:
    return tuple(HistoryEntry(ItemId(h["item_id"]), float(h["rating"]), h["review"],
                              int(h["timestamp"])) for h in payload["history"])


def item_loss_tiers(store) -> list:
    """The leaf tiers of `store` whose evictions can drop an item chunk from it altogether:
    the lowest tier below memory (the disk) when there is one, else the memory tier or parts
    that hold items (a `history` partition holds review chunks only). [] with a Redis tier."""
    from ..kvstore.wiring import PartitionedStore, tiers

    every = tiers(store)
    if any(hasattr(t, "client") for t in every):          # RedisStore (tier_stats' own test)
        return []
    tiered = [t for t in every if hasattr(t, "memory") and hasattr(t, "lower")]
    if tiered and tiered[0].lower:
        return [tiered[0].lower[-1]]
    history = {id(p) for t in every if isinstance(t, PartitionedStore)
               for kind, p in t.partitions.items() if kind == "history"}
    return [t for t in every if hasattr(t, "evictions") and id(t) not in history]


class EngineHost:
    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine.builder.catalog, dict):
            raise RcllmError("serving needs a mutable (dict) catalog")
        self.engine = engine
        self.catalog: dict[ItemId, Item] = engine.builder.catalog
        self.lock = threading.Lock()
        self._latest: dict[ItemId, int] = {}   # newest version requested, per pending id
        self._versions = itertools.count(1)    # one counter for all ids: versions never repeat
        self._builds: queue.Queue = queue.Queue()
        self._mu = threading.Lock()            # guards the version map
        self._thread = threading.Thread(target=self._build_loop, name="rcllm-items", daemon=True)
        self._thread.start()
        self._loss_tiers: list | None = None    # item_loss_tiers(store), found on first use
        self._evictions_seen = 0

    # ---- requests -------------------------------------------------------------------------
    def rank(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Ranks a request given as `schemas.RankIn.model_dump()`; raises RcllmError."""
        req = RankRequest(
            user_id=payload["user_id"], history=history_of(payload),
            candidates=tuple(ItemId(c) for c in payload["candidates"]))
        overrides = {k: payload[k] for k in ("item_ratio", "history_ratio")
                     if payload.get(k) is not None}
        t0 = time.perf_counter()
        with self.lock:
            waited_ms = (time.perf_counter() - t0) * 1e3   # behind other calls on this engine
            res = self.engine.rank(req, payload.get("method"), **overrides)
        return {"ranking": list(res.ranking), "scores": res.scores, "method": res.method,
                "ttft_ms": res.ttft_ms, "total_ms": res.total_ms,
                # plain data (the engine's stats may be a Mapping)
                "stats": {**dict(res.stats), "lock_wait_ms": waited_ms}}

    def prewarm(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Pre-inference of `schemas.PrewarmIn.model_dump()`: the user side into the
        user-prefix cache ({tokens, computed}); RcllmError without the pointwise scorer."""
        with self.lock:
            return dict(self.engine.prewarm(payload["user_id"], history_of(payload)))

    def user_prefix_stats(self) -> dict[str, float] | None:
        """The user-prefix cache's counters (hits, misses, bytes, ...), None without one."""
        cache = self.engine.user_prefixes
        return None if cache is None else dict(cache.stats())

    def store_stats(self) -> dict[str, dict[str, int]]:
        """Per-tier chunk-store counters (kvstore.wiring.tier_stats), for /metrics."""
        from ..kvstore.wiring import tier_stats

        return tier_stats(self.engine.store)

    def holds_user_prefix(self, user_id: str) -> bool:
        """Whether this engine's user-prefix cache holds a live user side of `user_id`."""
        cache = self.engine.user_prefixes
        return cache is not None and cache.latest(user_id) is not None

    # ---- catalog ----------------------------------------------------------------------------
    def submit_items(self, items: list[Item]) -> None:
        """Queues builds; the items become visible once built. Raises Overloaded when too
        many builds are pending."""
        with self._mu:
            if self.pending() + len(items) > MAX_PENDING_BUILDS:
                raise Overloaded(5)
            jobs = []
            for it in items:
                self._latest[it.item_id] = next(self._versions)
                jobs.append((it, self._latest[it.item_id]))
        self._builds.put(jobs)

    def delete_item(self, item_id: ItemId) -> bool:
        """Removes the item now (and cancels its pending builds); False when unknown, which
        changes nothing (an unknown id leaves no trace in the version map)."""
        with self.lock, self._mu:   # the order _build_one takes them
            if item_id not in self.catalog and not self._is_pending(item_id):
                return False
            self._settle(item_id)   # queued builds of older versions now find no match
            self.catalog.pop(item_id, None)
            self._forget_chunk(item_id)
        return True

    def item(self, item_id: ItemId) -> tuple[Item | None, bool]:
        """(the item requests see now or None, whether a newer version is being built)."""
        with self._mu:
            return self.catalog.get(item_id), self._is_pending(item_id)

    def pending(self) -> int:
        return len(self._latest)

    def _is_pending(self, item_id: ItemId) -> bool:
        return item_id in self._latest

    def _settle(self, item_id: ItemId) -> None:
        """Nothing is pending for `item_id` any more: forget its version (holding _mu)."""
        self._latest.pop(item_id, None)

    def item_tokens(self) -> dict[str, int]:
        """Token count of every catalog item's chunk (for routing estimates)."""
        with self.lock:
            return {str(i): len(self.engine.builder.item_chunk(i)) for i in list(self.catalog)}

    def cached_items(self) -> list[str]:
        """Catalog items whose chunk KV is in this engine's store now."""
        with self.lock:
            b, e = self.engine.builder, self.engine
            return [str(i) for i in list(self.catalog)
                    if e.store.contains(e.chunk_key("item", b.item_chunk(i)))]

    def resident_change(self) -> list[str] | None:
        """`cached_items()` when a tier that can drop an item chunk from this store altogether
        has evicted since the last call (the router then replaces its picture of this
        instance), else None. Always None beside a Redis tier: the router counts every placed
        item as held by every instance there (`views.live_instances`)."""
        if self._loss_tiers is None:
            self._loss_tiers = item_loss_tiers(self.engine.store)
        if not self._loss_tiers:
            return None
        evicted = sum(int(t.evictions) for t in self._loss_tiers)
        if evicted == self._evictions_seen:
            return None
        self._evictions_seen = evicted
        return self.cached_items()

    def build_items(self, item_ids: list[str]) -> int:
        with self.lock:
            return self.engine.build_items([ItemId(i) for i in item_ids if i in self.catalog])

    def export_items(self, item_ids: list[str], wait_s: float = 1.0) -> dict[str, tuple]:
        """(token ids, K, V as numpy) of those `item_ids` whose chunk KV is in the store. Waits
        at most `wait_s` for the engine (a busy or stuck owner exports nothing: the importer
        recomputes rather than waits on another instance's queue)."""
        out: dict[str, tuple] = {}
        if not self.lock.acquire(timeout=wait_s):
            return out
        try:
            e = self.engine
            for i in item_ids:
                if ItemId(i) not in self.catalog:
                    continue
                kv = e.store.get(e.chunk_key("item", e.builder.item_chunk(ItemId(i))))
                if kv is not None:
                    out[i] = (kv.token_ids, kv.k.cpu().numpy(), kv.v.cpu().numpy())
        finally:
            self.lock.release()
        return out

    def import_items(self, rows: dict[str, tuple]) -> int:
        """Stores KV exported by another instance of the same model; returns how many chunks
        were new. A chunk is keyed by this engine's own content key of its token ids and used
        only when they are the ids this catalog gives the item now (else it is skipped)."""
        import torch

        new = 0
        with self.lock:
            e = self.engine
            for item_id, (ids, k, v) in rows.items():
                if ItemId(item_id) not in self.catalog:
                    continue
                if tuple(e.builder.item_chunk(ItemId(item_id))) != tuple(ids):
                    continue
                key = e.chunk_key("item", ids)
                if not e.store.contains(key):
                    dev = e.model.device
                    e.store.put(key, ChunkKV(tuple(ids), torch.from_numpy(k).to(dev),
                                             torch.from_numpy(v).to(dev)))
                    new += 1
        return new

    def close(self) -> None:
        self._builds.put(None)
        self._thread.join(timeout=30)

    def _forget_chunk(self, item_id: ItemId) -> None:
        # PromptBuilder memoises item token ids by id; an updated item must be re-tokenised.
        self.engine.builder.forget_item(item_id)

    def _build_loop(self) -> None:
        while True:
            jobs = self._builds.get()
            if jobs is None:
                return
            for item, version in jobs:
                try:
                    self._build_one(item, version)
                except Exception:  # noqa: BLE001 - a bad item must not stop the builder
                    log.exception("building item %s failed", item.item_id)
                    with self._mu:
                        if self._latest.get(item.item_id) == version:
                            self._settle(item.item_id)

    def _build_one(self, item: Item, version: int) -> None:
        e = self.engine
        if self._latest.get(item.item_id) != version:
            return                              # superseded before we started
        scratch = PromptBuilder(e.loaded.tokenizer, {item.item_id: item}, e.cfg.prompt,
                                e.model.arch.max_positions, e.scorer)
        ids = scratch.item_chunk(item.item_id)
        with self.lock:                          # build first ...
            key = e.chunk_key("item", ids)
            if not e.store.contains(key):
                e.store.put(key, e.compute_chunk("item", ids))
            with self._mu:                       # ... then swap, unless superseded meanwhile
                if self._latest.get(item.item_id) != version:
                    return
                self.catalog[item.item_id] = item
                self._forget_chunk(item.item_id)
                self._settle(item.item_id)
