"""The router's picture of an instance's item KV follows its store's evictions: an instance
reports what it holds after an item chunk was dropped (`EngineHost.resident_change`), and the
router's view (`LiveInstance.finished`) replaces its set with that report."""

from __future__ import annotations

import dataclasses

from rcllm.config import ModelConfig, RcllmConfig, ReuseConfig
from rcllm.kvstore.base import MemoryLRUStore
from rcllm.kvstore.wiring import build_store, close_store
from rcllm.launch import make_stored_engine
from rcllm.serve.host import EngineHost, item_loss_tiers
from rcllm.serve.views import LiveInstance


def test_an_instance_reports_what_it_holds_after_an_eviction(tiny_model_dir, synthetic,
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
        assert host.resident_change() is None    # nothing evicted yet
        host.build_items(items)                  # the first-built items are pushed out
        held = host.resident_change()
        assert held is not None and 0 < len(held) < len(items)
        assert sorted(held) == sorted(host.cached_items())
        assert items[0] not in held and items[-1] in held
        assert host.resident_change() is None    # reported once per eviction
        # review chunks evict only in their own partition: no new report
        body = {**rank_bodies[0], "candidates": held[:4], "method": "naive"}
        body["history"] = [{**h, "review": f"{h['review']} fresh words {n} " * 20}
                           for n, h in enumerate(body["history"])]
        host.rank(body)
        engine.store.flush()
        assert engine.store.inner.partitions["history"].evictions > 0
        assert host.resident_change() is None
    finally:
        host.close()


def test_the_tiers_whose_evictions_drop_an_item(tmp_path):
    memory_only = build_store(1 << 20, history_bytes=1 << 10)
    loss = item_loss_tiers(memory_only)
    assert len(loss) == 1 and isinstance(loss[0], MemoryLRUStore)
    assert loss[0] is memory_only.inner.default  # not the history partition
    with_disk = build_store(1 << 20, kv_dir=tmp_path / "kv")
    try:
        assert [type(t).__name__ for t in item_loss_tiers(with_disk)] == ["DiskStore"]
    finally:
        close_store(with_disk)
    # beside Redis the router counts every item as everywhere: nothing to report
    with_redis = build_store(1 << 20, redis_url="redis://127.0.0.1:1")
    try:
        assert item_loss_tiers(with_redis) == []
    finally:
        close_store(with_redis)


def test_the_routers_view_takes_the_report():
    inst = LiveInstance(0, {"a", "b", "c"})
    inst.started(100.0)
    inst.finished(100.0, 90.0, ["d"])            # no report: the candidates join
    assert inst.cached == {"a", "b", "c", "d"}
    inst.started(100.0)
    inst.finished(100.0, 90.0, ["e"], resident=["c", "d"])
    assert inst.cached == {"c", "d", "e"}        # replaced, then this answer's candidates
    assert inst.inflight == 0 and inst.served == 2
