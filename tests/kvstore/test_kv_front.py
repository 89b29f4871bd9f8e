"""StoreFront: misses built behind the answer, once per key; counts per chunk kind; per-tier
latency and the disk tier's per-kind counters in `tier_stats`."""

import dataclasses
import threading
import time

import torch

from kv_helpers import FP, make_entry

from rcllm.kvstore.base import MemoryLRUStore, chunk_key
from rcllm.kvstore.codec import KeyCheck
from rcllm.kvstore.disk import DiskStore
from rcllm.kvstore.front import StoreFront
from rcllm.kvstore.tiered import TieredStore
from rcllm.kvstore.wiring import build_store, close_store, tier_stats


def test_concurrent_misses_of_one_chunk_compute_it_once():
    key, kv = make_entry(1)
    store = StoreFront(MemoryLRUStore(1 << 20), check=KeyCheck(FP))
    release, calls = threading.Event(), []

    def compute():
        calls.append(1)
        release.wait(5)
        return kv

    assert store.build_behind(key, "item@x", compute)           # queued: never blocks
    assert not store.build_behind(key, "item@x", compute)       # already building: shared
    joined = []
    t = threading.Thread(target=lambda: joined.append(store.build_now(key, compute)))
    t.start()                                                   # joins the build in flight
    time.sleep(0.2)
    assert store.get(key) is None                               # not built yet
    release.set()
    t.join(5)
    store.flush()
    assert len(calls) == 1 and store.get(key) is not None
    st = store.stats()
    assert st["build_queued"] == 1 and st["build_shared"] == 1 and st["build_queue"] == 0
    assert st["kind_misses:item"] == 2 and st["kind_hits:item"] == 1
    assert st["get_count"] == 2 and st["get_le_1"] == 2
    store.check_invariants()
    store.close()


def test_a_full_build_queue_drops_and_a_failing_build_is_counted():
    store = StoreFront(MemoryLRUStore(1 << 20), queue_size=1)
    gate = threading.Event()
    entries = [make_entry(i) for i in range(4)]

    def slow(kv):
        def run():
            gate.wait(5)
            return kv
        return run

    store.build_behind(entries[0][0], "item", slow(entries[0][1]))   # running (or queued)
    time.sleep(0.1)
    store.build_behind(entries[1][0], "item", slow(entries[1][1]))   # queued
    assert not store.build_behind(entries[2][0], "item", slow(entries[2][1]))   # full
    gate.set()
    store.flush()

    def boom():
        raise RuntimeError("no")

    store.build_behind(entries[3][0], "history", boom)
    store.flush()
    st = store.stats()
    assert st["build_dropped"] == 1 and st["build_errors"] == 1 and st["build_built"] == 2
    assert len(store) == 2 and st["kind_misses:history"] == 1
    store.close()
    assert not store.build_behind(entries[2][0], "item", slow(entries[2][1]))   # closed


def test_tier_stats_have_latency_and_disk_counters_by_kind(tmp_path):
    check = KeyCheck(FP, ("item@c", "history@c"))

    def entry(kind, seed):
        _, kv = make_entry(seed)
        return chunk_key(FP, kind, kv.token_ids), kv

    store = build_store(1 << 20, tmp_path / "kv", 1 << 30, history_bytes=1 << 20)
    assert isinstance(store, StoreFront) and isinstance(store.inner, TieredStore)
    store.check = check
    for s in (store.inner.lower[0],):
        s.check = check
    store.inner.memory.check = check
    items = [entry("item@c", i) for i in range(3)]
    reviews = [entry("history@c", 10 + i) for i in range(2)]
    for key, kv in items + reviews:
        store.put(key, kv)
    store.flush()
    fresh = StoreFront(TieredStore(MemoryLRUStore(1 << 20),
                                   [DiskStore(tmp_path / "kv", 1 << 30, check)]), check=check)
    for key, _ in items + reviews:             # served by the other slot of the folder
        assert fresh.get(key) is not None
    rows = tier_stats(store)
    disk = rows["disk"]
    assert disk["kind_puts:item"] == 3 and disk["kind_puts:history"] == 2
    assert disk["kind_bytes:item"] + disk["kind_bytes:history"] == disk["bytes"] > 0
    assert disk["put_count"] == 5 and disk["put_sum_s"] > 0
    assert rows["memory"]["put_count"] == 3 and rows["memory-history"]["put_count"] == 2
    other = tier_stats(fresh)
    assert other["disk"]["kind_hits:item"] == 3 and other["disk"]["kind_hits:history"] == 2
    assert other["all"]["kind_hits:item"] == 3 and other["all"]["get_count"] == 5
    assert other["disk"]["get_le_1"] == 5
    store.check_invariants()
    fresh.check_invariants()
    close_store(fresh)
    close_store(store)


def test_the_engine_answers_before_its_misses_are_built(tiny_model_dir):
    """Write-back off the request path: a rank returns while its chunk builds still wait; they
    land afterwards, once each, and the next identical request hits every chunk."""
    from rcllm.commands.common import DEFAULT_SYNTHETIC
    from rcllm.launch import make_stored_engine
    from rcllm.config import ModelConfig, RcllmConfig
    from rcllm.eval.datasets import load_dataset
    from rcllm.eval.protocol import build_cases
    from rcllm.prompt.builder import RankRequest

    ds = load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)
    cfg = dataclasses.replace(RcllmConfig(), model=ModelConfig(path=str(tiny_model_dir),
                                                               threads=0))
    engine = make_stored_engine(cfg, dict(ds.items), history_bytes=64 << 20)
    case = build_cases(ds, history_window=10, num_negatives=4, seed=0, max_cases=1)[0]
    req = RankRequest(case.user_id, case.history, case.candidates)
    gate = threading.Event()
    many = engine.chunks.compute_many   # what a build behind runs: a kind's misses at once
    passes = []
    # builds wait for the gate (set below, or on a failure): no timeout that a slow, shared
    # machine could outlast while the request is still being answered
    engine.chunks.compute_many = lambda kind, chunks, *a, **k: (
        gate.wait(600), passes.append((kind, len(chunks))), many(kind, chunks, *a, **k))[2]
    try:
        first = engine.rank(req, "naive")        # returns although no build may run yet
        st = engine.store.stats()                # queued (or waiting at the gate), none built
        assert first.stats["chunk_misses"] > 0
        assert st["build_queue"] == first.stats["chunk_misses"]
        # one job per kind with misses, with its (computed, context) tokens: the sim prices it
        jobs = first.stats["behind_tokens"]
        assert 1 <= len(jobs) <= 2
        assert all(0 < n < ctx for n, ctx in jobs)     # built after the template context
        repeat = engine.rank(req, "naive")       # misses again: its builds are in flight
        assert repeat.stats["behind_tokens"] == []
        assert engine.store.stats()["build_shared"] == first.stats["chunk_misses"]
        assert len(engine.store) == 0
    finally:
        gate.set()
    engine.store.flush()
    st = engine.store.stats()
    assert st["build_built"] == first.stats["chunk_misses"] and st["build_queue"] == 0
    # each kind's misses were built in one pass, by the first of their jobs to run
    assert len(passes) == len(jobs) and sum(n for _, n in passes) == first.stats["chunk_misses"]
    assert st["kind_misses:item"] + st["kind_misses:history"] == 2 * first.stats["chunk_misses"]
    again = engine.rank(req, "naive")
    assert again.stats["chunk_misses"] == 0
    st = engine.store.stats()
    assert st["kind_hits:item"] == len(case.candidates)
    assert st["kind_hits:history"] == again.stats["chunk_hits"] - len(case.candidates)
    engine.store.check_invariants()
    # each stored entry is what building that chunk alone after its kind's context gives
    chunks = ([("item", engine.builder.item_chunk(c)) for c in case.candidates]
              + [("history", engine.builder.history_chunk(e)) for e in case.history])
    for kind, ids in chunks:
        got, alone = engine.store.get(engine.chunks.key(kind, ids)), engine.chunks.compute(kind, ids)
        assert got is not None and torch.allclose(got.k, alone.k, atol=1e-5), kind
        assert torch.allclose(got.v, alone.v, atol=1e-5), kind
    close_store(engine.store)


def test_run_behind_runs_other_work_once_per_key():
    store = StoreFront(MemoryLRUStore(1 << 20))
    gate, done = threading.Event(), []

    def job():
        gate.wait(5)
        done.append(1)

    assert store.run_behind("user-side:u1", job)
    assert not store.run_behind("user-side:u1", job)           # queued or running: shared
    assert not done
    gate.set()
    store.flush()
    assert done == [1] and len(store) == 0                     # it stores nothing itself
    st = store.stats()
    assert st["build_queued"] == 1 and st["build_shared"] == 1 and st["build_built"] == 1
    store.run_behind("user-side:u2", lambda: 1 / 0)
    store.flush()
    assert store.stats()["build_errors"] == 1
    store.close()


def test_the_exact_user_side_is_built_behind_the_answer(tiny_model_dir):
    """reuse.user_side=behind on a store front: the miss is answered before the exact user
    side is computed (on the builder thread), and the next request hits it."""
    from rcllm.commands.common import DEFAULT_SYNTHETIC
    from rcllm.launch import make_stored_engine
    from rcllm.config import ModelConfig, RcllmConfig
    from rcllm.eval.datasets import load_dataset
    from rcllm.eval.protocol import build_cases
    from rcllm.prompt.builder import RankRequest
    from rcllm.userprefix import scoring

    ds = load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)
    cfg = dataclasses.replace(RcllmConfig(), model=ModelConfig(path=str(tiny_model_dir),
                                                               threads=0))
    engine = make_stored_engine(cfg, dict(ds.items), scorer="pointwise")
    case = build_cases(ds, history_window=10, num_negatives=4, seed=0, max_cases=1)[0]
    req = RankRequest(case.user_id, case.history, case.candidates)
    engine.build_history(case.history)
    engine.build_items(case.candidates)
    gate, compute = threading.Event(), scoring.compute_prefix
    scoring.compute_prefix = lambda *a: (gate.wait(10), compute(*a))[1]
    try:
        miss = engine.rank(req, "naive", user_side="behind")    # answers; the build waits
        assert miss.stats["user_prefix"] == "miss"
        assert engine.user_prefixes.latest(case.user_id) is None
        [(n, ctx)] = miss.stats["behind_tokens"]              # the exact user side, whole
        assert n == ctx >= len(case.history)
        assert engine.store.stats()["build_queue"] == 1
        gate.set()
        engine.store.flush()
    finally:
        scoring.compute_prefix = compute
    assert engine.user_prefixes.latest(case.user_id).exact
    assert engine.rank(req, "naive", user_side="behind").stats["user_prefix"] == "hit"
    close_store(engine.store)


def test_writes_still_queued_for_a_lower_tier_are_counted_and_waited_for(tmp_path, check):
    """Under load a build can finish (build_queue 0) while its write to the shared tier is
    still queued: another instance would miss it. tier_stats' `all` row counts those writes
    (`write_pending`) and the bench's wait_until_stored waits for them too."""
    from rcllm.loadgen.phases import wait_until_stored

    gate = threading.Event()

    class Slow(DiskStore):
        def put(self, key, value):
            gate.wait()
            super().put(key, value)

    front = StoreFront(TieredStore(MemoryLRUStore(1 << 20), [Slow(tmp_path, check=check)]))
    key, kv = make_entry(3)
    front.build_behind(key, "item", lambda: kv)
    deadline = time.monotonic() + 10
    while front.stats()["build_queue"] and time.monotonic() < deadline:
        time.sleep(0.01)
    row = tier_stats(front)["all"]
    assert row["build_queue"] == 0 and row["write_pending"] == 1
    assert not wait_until_stored(lambda: tier_stats(front), timeout_s=0.3)
    gate.set()
    assert wait_until_stored(lambda: tier_stats(front), timeout_s=10)
    assert tier_stats(front)["all"]["write_pending"] == 0
    close_store(front)


def test_a_requests_misses_are_queued_without_waiting_for_a_running_build():
    """The builder may start a kind's first job while the request thread (which holds its
    engine) is still queueing the others: that job builds every miss of the kind in one pass,
    and the request thread never waits for it (it once did, ~200–300 ms per request on a
    served instance, because the pass ran under the batch's lock)."""
    from types import SimpleNamespace

    from rcllm.config import ReuseConfig
    from rcllm.prefill.chunks import ChunkBuilder

    import queue

    started, gate, passes, jobs = threading.Event(), threading.Event(), [], queue.Queue()

    def compute_many(kind, chunks, reuse):
        passes.append(list(chunks))
        started.set()
        gate.wait(600)   # the build is still running while the request queues the rest
        return [tuple(c) for c in chunks]

    def run_jobs():  # the store's one builder thread: its jobs one at a time
        while (job := jobs.get()) is not None:
            job()

    builder = threading.Thread(target=run_jobs)
    builder.start()

    def build_behind(key, kind, compute):  # the builder takes the first job at once
        jobs.put(compute)
        started.wait(600)
        return True

    stub = SimpleNamespace(compute_many=compute_many, key=lambda kind, ids, reuse: ids,
                           context_len=lambda kind, reuse: 3,
                           store=SimpleNamespace(build_behind=build_behind))
    misses = [("history", (1, 2)), ("history", (3, 4, 5)), ("history", (6,))]
    done = threading.Event()
    out = []
    t = threading.Thread(target=lambda: (out.append(
        ChunkBuilder.build_behind(stub, misses, ReuseConfig())), done.set()))
    t.start()
    try:
        assert done.wait(30), "the request thread waited for a running build"
        assert out[0] == [(6, 9)]
    finally:
        gate.set()
        jobs.put(None)
        builder.join(30)
    assert passes == [[(1, 2), (3, 4, 5), (6,)]]   # one pass built all three


def test_the_builder_thread_yields_the_core_to_the_request_path():
    """`build_store(..., behind_nice=N)`: the thread that builds behind the answers runs N
    nicer than the caller (the engine's request threads keep their priority)."""
    import os

    def nice_of_this_thread():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    mine = nice_of_this_thread()
    for behind_nice, want in ((0, mine), (7, min(19, mine + 7))):
        store, seen = build_store(1 << 20, behind_nice=behind_nice), []
        store.run_behind("probe", lambda: seen.append(nice_of_this_thread()))
        store.flush()
        assert seen == [want] and nice_of_this_thread() == mine
        close_store(store)


def test_behind_nice_is_checked():
    import pytest

    from rcllm.config import ReuseConfig
    from rcllm.errors import RcllmError

    with pytest.raises(RcllmError, match="behind_nice"):
        ReuseConfig(behind_nice=20).validate()


def test_a_builder_that_cannot_lower_its_priority_still_builds(monkeypatch, caplog):
    """Where the kernel refuses a per-thread niceness the builder says so and builds anyway
    (a builder thread that died would leave every miss unbuilt)."""
    import os

    def refuse(*_a):
        raise OSError("no per-thread priorities here")

    monkeypatch.setattr(os, "setpriority", refuse)
    store, ran = build_store(1 << 20, behind_nice=10), []
    store.run_behind("probe", lambda: ran.append(1))
    deadline = time.monotonic() + 5      # not flush(): a dead builder would never drain
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [1] and "left at the engine's priority" in caplog.text
    close_store(store)
