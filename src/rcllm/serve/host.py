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
from typing import Any, Callable

from ..engine import Engine
from ..kvstore.base import ChunkKV
from ..kvstore.held import HeldIndex
from ..errors import RcllmError
from ..prompt.builder import PromptBuilder, RankRequest
from ..records import HistoryEntry, Item, ItemId
from .worker import Overloaded

log = logging.getLogger(__name__)
MAX_PENDING_BUILDS = 4096


def history_of(payload: dict[str, Any]) -> tuple[HistoryEntry, ...]:
    return tuple(HistoryEntry(ItemId(h["item_id"]), float(h["rating"]), h["review"],
                              int(h["timestamp"])) for h in payload["history"])


def item_tiers(store) -> list:
    """The leaf tiers of `store` that hold item chunks: its memory tier (not a `history`
    partition, which holds review chunks only) and the disk below it, when there is one; an
    item is held while either holds it. A shared Redis tier below them is not one of them:
    the router keeps its own picture of it (`serve.tier`)."""
    from ..kvstore.base import WatchedKeys
    from ..kvstore.wiring import PartitionedStore, tiers

    every = tiers(store)
    history = {id(p) for t in every if isinstance(t, PartitionedStore)
               for kind, p in t.partitions.items() if kind == "history"}
    return [t for t in every if isinstance(t, WatchedKeys) and id(t) not in history]


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
        # the catalog items the store holds (kvstore.held), made on first use; False: none
        # can be kept (a Redis tier)
        self._held: HeldIndex | None | bool = None
        self._snapshot: list = []   # (memory tier, its entries) saved by `keep_snapshot`

    # ---- requests -------------------------------------------------------------------------
    def rank(self, payload: dict[str, Any],
             first: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """Ranks a request given as `schemas.RankIn.model_dump()`; raises RcllmError. `first`
        runs under the same hold of the engine lock, before the ranking (an instance stores
        the item KV it imported there: one wait in this engine's line, not two); what it
        returns joins the stats."""
        req = RankRequest(
            user_id=payload["user_id"], history=history_of(payload),
            candidates=tuple(ItemId(c) for c in payload["candidates"]))
        overrides = {k: payload[k] for k in ("item_ratio", "history_ratio")
                     if payload.get(k) is not None}
        t0 = time.perf_counter()
        with self.lock:
            waited_ms = (time.perf_counter() - t0) * 1e3   # behind other calls on this engine
            before = first() if first is not None else {}
            res = self.engine.rank(req, payload.get("method"), **overrides)
        return {"ranking": list(res.ranking), "scores": res.scores, "method": res.method,
                "ttft_ms": res.ttft_ms, "total_ms": res.total_ms,
                # plain data (the engine's stats may be a Mapping)
                "stats": {**dict(res.stats), **before, "lock_wait_ms": waited_ms}}

    def prewarm(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Pre-inference of `schemas.PrewarmIn.model_dump()`: the user side into the
        user-prefix cache ({tokens, computed, engine_ms: the engine's time on it, lock_wait_ms:
        behind other calls}); RcllmError without the pointwise scorer."""
        t0 = time.perf_counter()
        with self.lock:
            t1 = time.perf_counter()
            out = dict(self.engine.prewarm(payload["user_id"], history_of(payload)))
            return {**out, "engine_ms": (time.perf_counter() - t1) * 1e3,
                    "lock_wait_ms": (t1 - t0) * 1e3}

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

    def prefix_cache_info(self) -> dict[str, Any]:
        """What the router's picture of this engine's prefix cache needs: `instruction_tokens`,
        the instruction's tokens the cache holds since start-up (every prompt's first blocks:
        a hit beyond them is a prompt's own), `capacity_tokens` (its capacity in tokens of this
        model's KV) and `inserts` (whether exact prompts are inserted, `reuse.prefix_insert`)."""
        e = self.engine
        with self.lock:
            ids = e.strategy.context_ids("instruction")
            found = e.prefix.match(ids, len(ids))
        if found is not None:
            per_token = sum(k.nbytes + v.nbytes for _s, k, v in found.pieces) / found.length
        else:       # an instruction shorter than a block: the model's KV per token
            per_token = e.model.arch.kv_bytes_per_token_fp32 * e.model.dtype.itemsize / 4
        return {"instruction_tokens": 0 if found is None else int(found.length),
                "capacity_tokens": int(e.prefix.store.capacity_bytes // max(1.0, per_token)),
                "inserts": bool(e.cfg.reuse.prefix_insert)}

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
            self._relabel(item_id)
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
        """Catalog items whose chunk KV is in this engine's store now: read off the held index
        (O(held), no engine lock once it exists); a scan where no tier can be watched."""
        index = self._held_index()
        return self.scan_cached_items() if index is None else index.held()

    def scan_cached_items(self) -> list[str]:
        """`cached_items()` found the slow way, under the engine lock: a content key and a
        store look-up per catalog item (about 11 µs each). The index's reference in tests."""
        with self.lock:
            b, e = self.engine.builder, self.engine
            return [str(i) for i in list(self.catalog)
                    if e.store.contains(e.chunk_key("item", b.item_chunk(i)))]

    def item_redis_keys(self, ids: list[str] | None = None) -> dict[str, str]:
        """Each catalog item's (or each of `ids`') chunk key in the shared Redis tier, for the
        router's picture of that tier (`serve.tier`); {} without a Redis tier."""
        from ..kvstore.redis_store import RedisStore
        from ..kvstore.wiring import tiers

        redis = next((t for t in tiers(self.engine.store) if isinstance(t, RedisStore)), None)
        if redis is None:
            return {}
        wanted = None if ids is None else set(map(str, ids))
        with self.lock:
            b, e = self.engine.builder, self.engine
            return {str(i): redis.redis_key(e.chunk_key("item", b.item_chunk(i)))
                    for i in list(self.catalog) if wanted is None or str(i) in wanted}

    def keep_snapshot(self) -> int:
        """Saves what every memory tier of the store holds now (references, no copy), for
        `restore_snapshot` to put back; returns the entries saved. RcllmError beside a Redis
        or disk tier (`kvstore.wiring.memory_tiers`)."""
        from ..kvstore.wiring import memory_tiers

        with self.lock:
            self._snapshot = [(t, t.snapshot()) for t in memory_tiers(self.engine.store)]
            return sum(len(entries) for _t, entries in self._snapshot)

    def restore_snapshot(self) -> list[str]:
        """Puts back what `keep_snapshot` saved (every later put and eviction undone; the held
        index follows); returns the catalog items held after, the router's new picture of this
        instance. Queued builds must have drained first (a sweep's cells end so)."""
        if not self._snapshot:
            raise RcllmError("no snapshot of the store was kept (keep_snapshot first)")
        with self.lock:
            for tier, entries in self._snapshot:
                tier.restore(entries)
        self.lost_items()           # reported to the router by the picture returned here
        return self.cached_items()

    def lost_items(self) -> list[str] | None:
        """The catalog items whose chunk KV this store dropped (evicted from every tier that
        held it) since the last call and does not hold again, or None when there are none: the
        router takes them out of its picture of this instance. O(lost): no scan of the
        catalog or the store. Beside a Redis tier: what this instance's own memory (and disk)
        lost; the tier's losses reach the router from Redis (`serve.tier`)."""
        index = self._held_index()
        lost = index.take_lost() if index is not None else None
        return lost or None

    def _held_index(self) -> HeldIndex | None:
        """The index of the catalog items the store holds (`kvstore.held`), made on first use:
        every catalog item labelled with its chunk's key once (the one O(catalog) pass), then
        kept by the tiers' puts and drops and by item updates (`_relabel`)."""
        if self._held is None:
            found = item_tiers(self.engine.store)
            with self.lock:
                if self._held is None and not found:
                    self._held = False
                elif self._held is None:
                    index = HeldIndex(found)
                    b, e = self.engine.builder, self.engine
                    for i in list(self.catalog):
                        index.label(str(i), e.chunk_key("item", b.item_chunk(i)))
                    self._held = index
        return self._held or None

    def _relabel(self, item_id: ItemId, key=None) -> None:
        """An item's chunk key changed (`key`, its new one) or it left the catalog (None):
        the held index follows (caller holds the engine lock)."""
        if self._held:
            if key is None:
                self._held.unlabel(str(item_id))
            else:
                self._held.label(str(item_id), key)

    def build_items(self, item_ids: list[str]) -> int:
        with self.lock:
            return self.engine.build_items([ItemId(i) for i in item_ids if i in self.catalog])

    def export_items(self, item_ids: list[str],
                     wait_s: float = 1.0) -> tuple[dict[str, tuple], float]:
        """(token ids, K, V as numpy[, states, their layer]) of those `item_ids` whose chunk KV
        is in the store (the states where the entry carries them: `ChunkKV.states`), and
        the ms waited for the engine lock first. Waits at most `wait_s` for the engine (a busy
        or stuck owner exports nothing: the importer recomputes rather than waits on another
        instance's queue)."""
        out: dict[str, tuple] = {}
        t0 = time.perf_counter()
        got = self.lock.acquire(timeout=wait_s)
        waited_ms = (time.perf_counter() - t0) * 1e3
        if not got:
            return out, waited_ms
        try:
            e = self.engine
            for i in item_ids:
                if ItemId(i) not in self.catalog:
                    continue
                kv = e.store.get(e.chunk_key("item", e.builder.item_chunk(ItemId(i))))
                if kv is not None:
                    out[i] = (kv.token_ids, kv.k.cpu().numpy(), kv.v.cpu().numpy())
                    if kv.states is not None:   # the late join's states travel with it
                        out[i] += (kv.states.cpu().numpy(), kv.states_layer)
        finally:
            self.lock.release()
        return out, waited_ms

    def store_rows(self, rows: dict[str, tuple]) -> int:
        """Stores item KV exported by another instance of the same model (`export_items`'
        rows); returns how many chunks were new. The caller holds `lock`. A chunk is keyed by
        this engine's own content key of its token ids and used only when they are the ids
        this catalog gives the item now (else it is skipped)."""
        import torch

        new = 0
        e = self.engine
        for item_id, (ids, k, v, *states) in rows.items():
            if ItemId(item_id) not in self.catalog:
                continue
            if tuple(e.builder.item_chunk(ItemId(item_id))) != tuple(ids):
                continue
            key = e.chunk_key("item", ids)
            if not e.store.contains(key):
                dev = e.model.device
                h = (torch.from_numpy(states[0]).to(dev), int(states[1])) if states else ()
                e.store.put(key, ChunkKV(tuple(ids), torch.from_numpy(k).to(dev),
                                         torch.from_numpy(v).to(dev), *h))
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
                self._relabel(item.item_id, key)
                self._settle(item.item_id)
