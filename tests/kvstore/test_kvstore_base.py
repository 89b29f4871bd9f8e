import torch

from rcllm.kvstore import ChunkKV, MemoryLRUStore, chunk_key


def _entry(n: int) -> ChunkKV:
    return ChunkKV(tuple(range(n)), torch.zeros(2, 1, n, 4), torch.zeros(2, 1, n, 4))


def test_key_depends_on_fingerprint_kind_and_tokens():
    base = chunk_key("fp1", "item", [1, 2, 3])
    assert base == chunk_key("fp1", "item", [1, 2, 3])
    assert base != chunk_key("fp2", "item", [1, 2, 3])
    assert base != chunk_key("fp1", "history", [1, 2, 3])
    assert base != chunk_key("fp1", "item", [1, 2, 4])


def test_lru_evicts_by_bytes_and_keeps_accounting():
    one = _entry(4).nbytes
    store = MemoryLRUStore(capacity_bytes=3 * one)
    for i in range(3):
        store.put(f"k{i}", _entry(4))
    assert store.get("k0") is not None  # k0 becomes most recent
    store.put("k3", _entry(4))          # evicts k1, the least recent
    assert not store.contains("k1")
    assert store.contains("k0") and store.contains("k3")
    assert store.nbytes == 3 * one and store.evictions == 1
    store.check_invariants()
    store.put("huge", _entry(100))      # larger than the budget: not stored
    assert not store.contains("huge")
    store.check_invariants()
