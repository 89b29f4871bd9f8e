import os

from kv_helpers import FP, make_entry, same

from rcllm.kvstore.base import ChunkKV, chunk_key
from rcllm.kvstore.codec import KeyCheck, encode
from rcllm.kvstore.disk import DiskStore


def test_put_get_survives_reopen(tmp_path, check):
    store = DiskStore(tmp_path, check=check)
    entries = [make_entry(i) for i in range(5)]
    for key, kv in entries:
        store.put(key, kv)
    store.check_invariants()
    store.close()                       # frees its slot: the next store takes it over
    reopened = DiskStore(tmp_path, check=check)
    reopened.check_invariants()
    assert len(reopened) == 5 and reopened.nbytes == store.nbytes
    for key, kv in entries:
        assert same(reopened.get(key), kv)
    assert reopened.get(make_entry(99)[0]) is None and reopened.misses == 1


def test_lru_eviction_by_bytes(tmp_path, check):
    entries = [make_entry(i) for i in range(4)]
    probe = DiskStore(tmp_path / "probe", check=check)
    probe.put(*entries[0])
    one = probe.nbytes
    store = DiskStore(tmp_path / "s", capacity_bytes=3 * one, check=check)
    for key, kv in entries[:3]:
        store.put(key, kv)
    assert store.get(entries[0][0]) is not None   # 0 becomes most recent
    store.put(*entries[3])                         # evicts 1
    assert not store.contains(entries[1][0])
    assert store.contains(entries[0][0]) and store.contains(entries[3][0])
    assert store.evictions == 1
    store.check_invariants()


def test_corrupt_file_is_dropped_and_reported_as_miss(tmp_path, check):
    store = DiskStore(tmp_path, check=check)
    key, kv = make_entry(0)
    store.put(key, kv)
    path = store._path(key)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert store.get(key) is None
    assert store.corrupt == 1 and not store.contains(key) and not path.exists()
    store.check_invariants()


def test_mismatched_entries_are_never_served(tmp_path, check):
    store = DiskStore(tmp_path, check=check)
    key, kv = make_entry(1)
    # a file with intact bytes whose token ids do not belong to the key
    liar = ChunkKV(kv.token_ids[::-1], kv.k, kv.v)
    store.put(key, kv)
    store._path(key).write_bytes(encode(key, liar, kind="item", fingerprint=FP))
    assert store.get(key) is None and store.corrupt == 1
    # an entry written by another model's store, read by this model's store
    other = DiskStore(tmp_path / "other", check=KeyCheck("model-fp-2"))
    foreign_key = chunk_key("model-fp-2", "item", kv.token_ids)
    other.put(foreign_key, kv)
    mixed = DiskStore(tmp_path / "other", check=check)
    assert mixed.get(foreign_key) is None and mixed.corrupt == 1
    # a put whose key was made with another fingerprint is refused
    store.put(foreign_key, kv)
    assert store.rejected == 1 and not store.contains(foreign_key)
    store.check_invariants()


def test_reopen_removes_own_temp_files_and_keeps_foreign_ones(tmp_path, check):
    store = DiskStore(tmp_path, check=check)
    key, kv = make_entry(2)
    store.put(key, kv)
    shard = store._path(key).parent
    own_tmp = store._path(key).with_name(store._path(key).name + ".123.0.tmp")
    own_tmp.write_bytes(b"half")                       # a crashed writer's leftover
    (shard / "x.tmp").write_bytes(b"half")              # not a name the store writes
    (shard / "junk.safetensors").write_bytes(b"garbage")
    store.close()
    reopened = DiskStore(tmp_path, check=check)
    reopened.check_invariants()
    assert len(reopened) == 1 and same(reopened.get(key), kv)
    assert not own_tmp.exists()
    assert (shard / "x.tmp").read_bytes() == b"half"
    assert (shard / "junk.safetensors").read_bytes() == b"garbage"


def test_int8_disk_tier_stores_less(tmp_path, check):
    key, kv = make_entry(3, num_tokens=64)
    raw = DiskStore(tmp_path / "raw", check=check)
    small = DiskStore(tmp_path / "int8", check=check, encoding="int8")
    raw.put(key, kv)
    small.put(key, kv)
    assert small.nbytes < 0.5 * raw.nbytes
    back = small.get(key)
    assert back.token_ids == kv.token_ids and (back.k - kv.k).abs().max() < 0.05
