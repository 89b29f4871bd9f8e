"""The disk tier touches only its own files: marked folders, slots per process, foreign files
kept (issue 17, hazards)."""

import os
import subprocess
import sys
import textwrap

import pytest
from kv_helpers import make_entry, same

from rcllm.errors import RcllmError
from rcllm.kvstore.disk import MARKER, DiskStore


def _listing(root):
    return sorted((p.relative_to(root), p.read_bytes() if p.is_file() else None)
                  for p in root.rglob("*"))


def test_a_folder_with_user_files_is_refused_and_left_untouched(tmp_path, check):
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    (home / "docs" / "ab.safetensors").write_bytes(b"not KV")
    before = _listing(home)
    with pytest.raises(RcllmError, match="not an rcllm KV store"):
        DiskStore(home, check=check)
    assert _listing(home) == before


def test_new_folder_is_marked_and_only_store_names_are_written(tmp_path, check):
    store = DiskStore(tmp_path / "kv", check=check)
    for i in range(3):
        store.put(*make_entry(i))
    names = {p.relative_to(tmp_path / "kv").as_posix() for p in (tmp_path / "kv").rglob("*")
             if p.is_file()}
    assert MARKER in names and "slot-0/.lock" in names
    entries = names - {MARKER, "slot-0/.lock"}
    assert len(entries) == 3 and all(n.startswith("slot-0/") and n.endswith(".rckv")
                                     for n in entries)


def test_two_stores_sharing_a_folder_never_delete_each_others_files(tmp_path, check):
    entries = [make_entry(i) for i in range(8)]
    a = DiskStore(tmp_path, check=check)
    for key, kv in entries[:3]:
        a.put(key, kv)
    one = a.nbytes // 3
    b = DiskStore(tmp_path, capacity_bytes=2 * one, check=check)    # a holds slot 0
    assert a.slot != b.slot
    assert same(b.get(entries[0][0]), entries[0][1]) and b.foreign_hits == 1
    for key, kv in entries[3:]:                        # b evicts, but only its own files
        b.put(key, kv)
    assert b.evictions == 3 and len(b) == 2
    a.check_invariants()
    b.check_invariants()
    assert all(a.contains(k) and a._path(k).exists() for k, _ in entries[:3])
    # a corrupt entry of the other slot is a counted miss and stays where it is
    path = a._path(entries[1][0])
    path.write_bytes(path.read_bytes()[:-5])
    assert b.get(entries[1][0]) is None and b.corrupt == 1 and path.exists()
    assert not b.contains(entries[1][0])


def test_slot_is_held_by_a_live_process_and_taken_over_after_it_exits(tmp_path, check):
    key, kv = make_entry(5)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from kv_helpers import make_entry, FP
        from rcllm.kvstore.codec import KeyCheck
        from rcllm.kvstore.disk import DiskStore
        s = DiskStore({str(tmp_path)!r}, check=KeyCheck(FP))
        s.put(*make_entry(5))
        print(s.slot.name, flush=True)
        sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "slot-0"
        mine = DiskStore(tmp_path, check=check)
        assert mine.slot.name == "slot-1" and len(mine) == 0
        assert same(mine.get(key), kv)                 # read from the other process's slot
        mine.close()
    finally:
        proc.communicate("\n", timeout=30)
    after = DiskStore(tmp_path, check=check)           # the exited process's slot is free
    assert after.slot.name == "slot-0" and len(after) == 1 and same(after.get(key), kv)
