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


class _Watcher:
    def __init__(self):
        self.keys: set = set()

    def added(self, key):
        assert key not in self.keys
        self.keys.add(key)

    def removed(self, key):
        self.keys.remove(key)


def test_a_snapshot_puts_back_the_entries_their_order_and_what_watchers_see():
    one = _entry(4).nbytes
    store, seen = MemoryLRUStore(capacity_bytes=3 * one), _Watcher()
    store.watch(seen)
    for i in range(3):
        store.put(f"k{i}", _entry(4))
    snap = store.snapshot()
    store.get("k0")
    store.put("k3", _entry(4))              # evicts k1
    store.put("k4", _entry(2))              # evicts k2
    store.restore(snap)
    assert [k for k, _ in store.snapshot()] == ["k0", "k1", "k2"] and seen.keys == {"k0", "k1",
                                                                                   "k2"}
    assert store.nbytes == 3 * one
    store.check_invariants()
    store.put("k5", _entry(4))              # the least recent of the snapshot goes first
    assert not store.contains("k0") and seen.keys == {"k1", "k2", "k5"}
