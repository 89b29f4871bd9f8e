"""Entry checks with the engine's real keys (`item@<context>`, `history@<context>`), and the
kind-partitioned memory tier that keeps client reviews from evicting catalog items."""

import dataclasses

from kv_helpers import FP, make_entry

from rcllm.commands.common import DEFAULT_SYNTHETIC
from rcllm.launch import make_stored_engine
from rcllm.config import ModelConfig, RcllmConfig
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.kvstore.base import MemoryLRUStore, chunk_key
from rcllm.kvstore.codec import KeyCheck, encode_checked
from rcllm.kvstore.wiring import PartitionedStore, engine_kinds


def test_engine_chunks_pass_the_check_and_reach_disk(tiny_model_dir, tmp_path):
    ds = load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)
    cfg = dataclasses.replace(RcllmConfig(), model=ModelConfig(path=str(tiny_model_dir),
                                                               threads=0))
    engine = make_stored_engine(cfg, dict(ds.items), kv_dir=tmp_path / "kv")
    case = build_cases(ds, history_window=10, num_negatives=4, seed=0, max_cases=1)[0]
    from rcllm.prompt.builder import RankRequest

    res = engine.rank(RankRequest(case.user_id, case.history, case.candidates), "naive",
                      chunk_context="instruction")   # a per-request context is keyed apart
    engine.store.flush()
    disk = engine.store.inner.lower[0]
    assert res.stats["chunk_misses"] > 0 and disk.rejected == 0
    assert len(disk) == res.stats["chunk_misses"]
    ids = engine.builder.item_chunk(case.candidates[0])
    key = engine.chunk_key("item", ids)
    kv = engine.compute_chunk("item", ids)
    assert engine.kind_tag("item").startswith("item@") and engine.kind_tag("item") in \
        engine_kinds(engine)
    assert encode_checked(key, kv, "raw", disk.check) is not None
    # the fixed kind list of before could not derive the engine's keys: every put refused
    assert encode_checked(key, kv, "raw", KeyCheck(engine.loaded.fingerprint)) is None


def test_reviews_have_their_own_budget():
    check = KeyCheck(FP, ("item@ctx", "history@ctx"))

    def entry(kind, seed):
        _, kv = make_entry(seed)
        return chunk_key(FP, kind, kv.token_ids), kv

    items = [entry("item@ctx", i) for i in range(3)]
    one = items[0][1].nbytes
    store = PartitionedStore(MemoryLRUStore(3 * one), {"history": MemoryLRUStore(2 * one)}, check)
    for key, kv in items:
        store.put(key, kv)
    for i in range(50):                         # a flood of client-supplied reviews
        store.put(*entry("history@ctx", 100 + i))
    assert all(store.get(key) is not None for key, _ in items)
    assert len(store) == 5 and store.nbytes == 5 * one
    store.check_invariants()
    # without a check every entry shares the default part: the flood evicts the items
    shared = PartitionedStore(MemoryLRUStore(3 * one), {"history": MemoryLRUStore(2 * one)})
    for key, kv in items:
        shared.put(key, kv)
    for i in range(50):
        shared.put(*entry("history@ctx", 100 + i))
    assert all(shared.get(key) is None for key, _ in items)
