"""The held index (kvstore/held.py): which labelled entries the tiers hold, kept by the tiers'
own puts and drops, equals a scan of the tiers after any mix of puts, reads, evictions,
corrupt drops and re-labels; and a loss is reported once, only when no watched tier holds the
entry any more."""

from __future__ import annotations

import random

from kv_helpers import make_entry

from rcllm.kvstore.base import MemoryLRUStore
from rcllm.kvstore.disk import DiskStore
from rcllm.kvstore.held import HeldIndex


def scan(index_labels: dict[str, str], memory: MemoryLRUStore, disk: DiskStore) -> set[str]:
    """The labels held, found the slow way: a look-up of every label's key in each tier."""
    return {name for name, key in index_labels.items()
            if memory.contains(key) or key in disk._index}


def test_the_index_equals_a_scan_after_puts_evictions_and_relabels(tmp_path, check):
    entries = [make_entry(i) for i in range(24)]
    one = entries[0][1].nbytes
    memory = MemoryLRUStore(capacity_bytes=5 * one)
    disk = DiskStore(tmp_path, capacity_bytes=9 * (one + 400), check=check)
    memory.put(*entries[0])
    disk.put(*entries[1])                 # held before the index exists: replayed by watch()
    index = HeldIndex([memory, disk])
    labels = {f"item{n}": entries[n][0] for n in range(0, 24, 2)}   # half the keys labelled
    for name, key in labels.items():
        index.label(name, key)
    rng = random.Random(0)
    for step in range(300):
        key, kv = entries[rng.randrange(len(entries))]
        op = rng.random()
        if op < 0.4:
            memory.put(key, kv)
        elif op < 0.7:
            disk.put(key, kv)
        elif op < 0.85:
            memory.get(key)
            disk.get(key)
        elif op < 0.95:   # an item update: its chunk has another key now (maybe another's)
            name = rng.choice(sorted(labels))
            labels[name] = key
            index.label(name, key)
        else:                             # a corrupt file, dropped on read
            own = list(disk._index)
            if own:
                disk._path(own[0]).write_bytes(b"garbage")
                disk.get(own[0])
        index.check_invariants()
        assert set(index.held()) == scan(labels, memory, disk), step
    assert memory.evictions > 0 and disk.evictions > 0 and disk.corrupt > 0


def test_a_loss_is_reported_once_and_only_when_no_tier_holds_the_entry(tmp_path, check):
    entries = [make_entry(i) for i in range(4)]
    one = entries[0][1].nbytes
    memory = MemoryLRUStore(capacity_bytes=2 * one)
    disk = DiskStore(tmp_path, check=check)
    index = HeldIndex([memory, disk])
    for n, (key, _) in enumerate(entries):
        index.label(f"i{n}", key)
    memory.put(*entries[0])
    disk.put(*entries[0])
    memory.put(*entries[1])
    memory.put(*entries[2])               # evicts i0 from memory: still on disk
    assert index.take_lost() == []
    memory.put(*entries[3])               # evicts i1: gone from every tier
    assert index.take_lost() == ["i1"]
    assert index.take_lost() == []        # reported once
    memory.put(*entries[0])               # evicts i2 ...
    memory.put(*entries[2])               # ... which comes back before anyone asked
    assert index.take_lost() == ["i3"]
    assert sorted(index.held()) == ["i0", "i2"]
    index.unlabel("i0")                   # an item deleted from the catalog
    assert index.take_lost() == ["i0"] and index.held() == ["i2"]
    index.check_invariants()
