import threading

import pytest
from kv_helpers import make_entry, same

from rcllm.kvstore.base import MemoryLRUStore
from rcllm.kvstore.disk import DiskStore
from rcllm.kvstore.redis_store import RedisStore
from rcllm.kvstore.singleflight import SingleFlight
from rcllm.kvstore.tiered import TieredStore


def _tiered(tmp_path, check, memory_bytes=1 << 20, **kw):
    return TieredStore(MemoryLRUStore(memory_bytes), [DiskStore(tmp_path, check=check)], **kw)


def test_write_behind_reaches_disk_after_flush(tmp_path, check):
    with _tiered(tmp_path, check) as store:
        entries = [make_entry(i) for i in range(6)]
        for key, kv in entries:
            store.put(key, kv)
            assert same(store.get(key), kv)  # visible at once
        store.flush()
        disk = store.lower[0]
        assert len(disk) == 6 and all(disk.contains(k) for k, _ in entries)
        store.check_invariants()
        assert store.stats()["pending"] == 0


def test_read_through_promotes_lower_hits(tmp_path, check):
    key, kv = make_entry(0)
    DiskStore(tmp_path, check=check).put(key, kv)
    with _tiered(tmp_path, check) as store:
        assert not store.memory.contains(key)
        assert same(store.get(key), kv)
        assert store.memory.contains(key) and store.hits_by_tier == [0, 1]
        store.get(key)
        assert store.hits_by_tier == [1, 1]
        store.check_invariants()


def test_redis_hit_is_promoted_to_memory_and_disk(tmp_path, check, redis_server):
    key, kv = make_entry(1)
    redis = RedisStore(port=redis_server.port, check=check)
    redis.put(key, kv)
    disk = DiskStore(tmp_path, check=check)
    with TieredStore(MemoryLRUStore(1 << 20), [disk, redis]) as store:
        assert same(store.get(key), kv) and store.hits_by_tier == [0, 0, 1]
        store.flush()
        assert disk.contains(key) and store.memory.contains(key)
        store.check_invariants()


def test_corrupt_lower_entry_is_a_miss_then_recomputed(tmp_path, check):
    key, kv = make_entry(2)
    disk = DiskStore(tmp_path, check=check)
    disk.put(key, kv)
    path = disk._path(key)
    path.write_bytes(path.read_bytes()[:-7])  # torn write
    with TieredStore(MemoryLRUStore(1 << 20), [disk]) as store:
        assert same(store.get_or_compute(key, lambda: kv), kv)
        assert disk.corrupt == 1 and store.computes == 1
        store.flush()
        assert same(disk.get(key), kv)  # rewritten by write-behind
        store.check_invariants()


def test_full_queue_drops_lower_writes_but_keeps_memory(tmp_path, check):
    gate = threading.Event()

    class Stuck(DiskStore):
        def put(self, key, value):
            gate.wait()
            super().put(key, value)

    store = TieredStore(MemoryLRUStore(1 << 20), [Stuck(tmp_path, check=check)], queue_size=1,
                        enqueue_timeout_s=0.01)
    entries = [make_entry(i) for i in range(5)]
    for key, kv in entries:
        store.put(key, kv)
    assert store.dropped_writes >= 2  # one in the writer, one queued, the rest dropped
    assert all(same(store.get(k), kv) for k, kv in entries)
    gate.set()
    store.close()
    store.check_invariants()
    assert store.stats()["pending"] == 0


def test_prefetch_warms_memory_for_queued_requests(tmp_path, check):
    entries = [make_entry(i) for i in range(5)]
    disk = DiskStore(tmp_path, check=check)
    for key, kv in entries:
        disk.put(key, kv)
    with TieredStore(MemoryLRUStore(1 << 20), [disk]) as store:
        assert store.prefetch([k for k, _ in entries[:3]]) == 3
        store.flush()
        assert all(store.memory.contains(k) for k, _ in entries[:3])
        assert not store.memory.contains(entries[3][0])
        assert store.prefetch([entries[0][0]]) == 0  # already warm
        store.check_invariants()


def test_singleflight_stampede_computes_once(tmp_path, check):
    key, kv = make_entry(3)
    store = _tiered(tmp_path, check)
    release, calls, results = threading.Event(), [], []

    def compute():
        calls.append(1)
        release.wait()
        return kv

    threads = [threading.Thread(target=lambda: results.append(store.get_or_compute(key, compute)))
               for _ in range(16)]
    for t in threads:
        t.start()
    while store._flight.waiters(key) < 15:  # everyone but the leader is parked on the flight
        threading.Event().wait(0.001)
    release.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and store.computes == 1 and len(results) == 16
    assert all(r is kv for r in results)
    store.close()
    store.check_invariants()


def test_singleflight_shares_exceptions_and_forgets_them():
    flight: SingleFlight[int] = SingleFlight()
    with pytest.raises(ValueError):
        flight.do("k", lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert flight.do("k", lambda: 7) == 7 and flight.leaders == 2
