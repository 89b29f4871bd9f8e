"""The router's picture of an instance's item KV follows its store's evictions: an instance
reports the items its store lost (`EngineHost.lost_items`), read off an index the store's
tiers keep (kvstore/held.py) rather than a scan of the catalog, and the router's view
(`LiveInstance.finished`) drops them."""

from __future__ import annotations

import dataclasses

from rcllm.config import ModelConfig, RcllmConfig, ReuseConfig
from types import SimpleNamespace

import torch

from rcllm.kvstore.base import ChunkKV, MemoryLRUStore, chunk_key
from rcllm.kvstore.wiring import build_store, close_store
from rcllm.launch import make_stored_engine
from rcllm.serve.host import EngineHost, item_tiers
from rcllm.serve.views import LiveInstance


def test_an_instance_reports_what_it_lost_after_an_eviction(tiny_model_dir, synthetic,
                                                            rank_bodies):
    model = ModelConfig(path=str(tiny_model_dir), threads=0)
    items = sorted(synthetic.items)
    probe = make_stored_engine(dataclasses.replace(RcllmConfig(), model=model),
                               dict(synthetic.items))
    probe.build_items(items)
    half = probe.store.nbytes // 2               # room for about half the catalog's item KV
    cfg = RcllmConfig(model=model, reuse=ReuseConfig(store_bytes=half))
    engine = make_stored_engine(cfg, dict(synthetic.items), history_bytes=half // 20)
    host = EngineHost(engine)
    try:
        assert host.lost_items() is None         # nothing evicted yet
        host.build_items(items)                  # the first-built items are pushed out
        lost = host.lost_items()
        held = host.cached_items()
        assert lost is not None and 0 < len(held) < len(items)
        assert sorted(held) == sorted(host.scan_cached_items())     # the index is a scan
        assert sorted(lost) == sorted(set(items) - set(held))
        assert items[0] in lost and items[-1] in held
        assert host.lost_items() is None         # reported once per eviction
        # review chunks evict only in their own partition: no new report
        body = {**rank_bodies[0], "candidates": held[:4], "method": "naive"}
        body["history"] = [{**h, "review": f"{h['review']} fresh words {n} " * 20}
                           for n, h in enumerate(body["history"])]
        host.rank(body)
        engine.store.flush()
        assert engine.store.inner.partitions["history"].evictions > 0
        assert host.lost_items() is None
        host._held.check_invariants()
    finally:
        host.close()


class _Builder:
    """The part of a PromptBuilder the host reads: the catalog and each item's token ids."""

    def __init__(self, n: int) -> None:
        self.catalog = {f"i{k}": None for k in range(n)}

    def item_chunk(self, item_id) -> tuple[int, ...]:
        return (int(item_id[1:]), 7, 7, 7)


def _fake_engine(items: int, room: int):
    """An engine as the host sees it (no model): a catalog of `items`, a memory store with
    room for `room` item chunks, the content key counted in `keys_hashed`."""
    one = _kv((0,)).nbytes
    engine = SimpleNamespace(builder=_Builder(items), store=build_store(room * one),
                             keys_hashed=0)

    def key(kind, ids):
        engine.keys_hashed += 1
        return chunk_key("fp", kind, ids)

    engine.chunk_key = key
    return engine


def _kv(ids) -> ChunkKV:
    return ChunkKV(tuple(ids), torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))


def test_eviction_reads_the_index_and_never_scans_the_catalog(monkeypatch):
    engine = _fake_engine(items=200, room=50)
    host = EngineHost(engine)
    try:
        assert host.cached_items() == []          # the index: labels every item once
        assert engine.keys_hashed == 200
        engine.keys_hashed = 0

        def no_scan(_self):
            raise AssertionError("the catalog was scanned")

        monkeypatch.setattr(EngineHost, "scan_cached_items", no_scan)
        ids = {i: engine.builder.item_chunk(i) for i in engine.builder.catalog}
        keys = {i: chunk_key("fp", "item", t) for i, t in ids.items()}
        for i in list(ids)[:120]:                # the first 70 are pushed out
            engine.store.put(keys[i], _kv(ids[i]))
        lost = host.lost_items()
        assert sorted(lost) == sorted(list(ids)[:70])
        assert sorted(host.cached_items()) == sorted(list(ids)[70:120])
        assert host.lost_items() is None
        assert engine.keys_hashed == 0           # no content key computed again
    finally:
        host.close()
        close_store(engine.store)


def test_the_tiers_that_hold_an_item(tmp_path):
    memory_only = build_store(1 << 20, history_bytes=1 << 10)
    held = item_tiers(memory_only)
    assert len(held) == 1 and isinstance(held[0], MemoryLRUStore)
    assert held[0] is memory_only.inner.default  # not the history partition
    with_disk = build_store(1 << 20, kv_dir=tmp_path / "kv")
    try:   # an item evicted from memory is still held while the disk has it
        assert [type(t).__name__ for t in item_tiers(with_disk)] == ["MemoryLRUStore",
                                                                     "DiskStore"]
    finally:
        close_store(with_disk)
    # beside Redis the instance reports its own memory; the router watches the tier itself
    with_redis = build_store(1 << 20, redis_url="redis://127.0.0.1:1")
    try:
        assert [type(t).__name__ for t in item_tiers(with_redis)] == ["MemoryLRUStore"]
    finally:
        close_store(with_redis)


def test_the_routers_view_takes_the_report():
    inst = LiveInstance(0, {"a", "b", "c"})
    inst.started(100.0)
    inst.finished(100.0, 90.0, ["d"])            # no report: the candidates join
    assert inst.cached == {"a", "b", "c", "d"}
    inst.started(100.0)
    inst.finished(100.0, 90.0, ["e"], lost=["b", "d", "x"])
    assert inst.cached == {"a", "c", "e"}        # the lost leave, this answer's candidates join
    assert inst.inflight == 0 and inst.served == 2
