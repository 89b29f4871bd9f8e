"""The user-prefix cache: hits, TTL, invalidation, LRU by bytes, spill, INT8, singleflight."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from up_helpers import FakeClock, make_ranker

from rcllm.errors import RcllmError
from rcllm.userprefix.cache import PrefixCacheConfig, UserPrefixCache
from rcllm.userprefix.entry import CachedPrefix
from rcllm.userprefix.kv import PrefixKV, StoredKV
from rcllm.bench.userprefix_workload import sample_candidates


def _entry(cache: UserPrefixCache, user: str, hist: str = "h", tokens: int = 10) -> CachedPrefix:
    kv = PrefixKV(torch.ones(2, 1, tokens, 4), torch.ones(2, 1, tokens, 4))
    return CachedPrefix(cache.key(user, hist), user, hist, 1, 0, StoredKV.of(kv, False))


def test_hit_miss_and_adaptive_ttl(tiny_loaded):
    clock = FakeClock()
    ranker, ds = make_ranker(tiny_loaded, clock)
    user = sorted(ds.users)[0]
    cands = sample_candidates(ds, 3, seed=0)
    assert not ranker.score(user, ds.users[user], cands).cached
    clock.now_s += 10.0
    assert ranker.score(user, ds.users[user], cands).cached
    assert ranker.cache.ttl_s(user) == 30.0  # 3 × the mean gap of 10 s
    clock.now_s += 31.0                      # past the TTL set at the last store
    assert not ranker.score(user, ds.users[user], cands).cached
    assert ranker.cache.expired == 1
    assert (ranker.cache.hits, ranker.cache.misses) == (1, 2)
    ranker.cache.check_invariants()


def test_ttl_capped_at_five_minutes():
    clock = FakeClock()
    cache = UserPrefixCache(PrefixCacheConfig(), "fp", clock)
    assert cache.ttl_s("u") == 300.0          # no gap seen yet
    cache.note_request("u")
    clock.now_s += 3600.0
    cache.note_request("u")
    assert cache.ttl_s("u") == 300.0
    assert UserPrefixCache(PrefixCacheConfig(ttl_s=7.0), "fp").ttl_s("u") == 7.0


def test_history_change_and_model_update_invalidate(tiny_loaded):
    ranker, ds = make_ranker(tiny_loaded)
    user = sorted(ds.users)[0]
    hist = ds.users[user]
    cands = sample_candidates(ds, 3, seed=0)
    ranker.score(user, hist, cands)
    old_key = ranker.cache.key(user, ranker.prompt.user_side(user, hist).history_hash)
    changed = hist[:-1]  # not an extension of the cached history: full recompute
    assert not ranker.score(user, changed, cands).cached
    assert ranker.cache.lookup(old_key, count=False) is None and len(ranker.cache) == 1
    ranker.cache.set_fingerprint("new-model")
    assert len(ranker.cache) == 0
    assert ranker.cache.lookup(old_key, count=False) is None
    assert not ranker.score(user, changed, cands).cached
    assert ranker.cache.latest(user).key.endswith(":new-model")
    ranker.cache.check_invariants()


def test_lru_by_bytes_spills_to_host_and_comes_back():
    clock = FakeClock()
    one = _entry(UserPrefixCache(PrefixCacheConfig(), "fp"), "x").stored.nbytes
    cache = UserPrefixCache(PrefixCacheConfig(max_bytes=2 * one, spill_bytes=one,
                                              spill_ttl_s=5.0), "fp", clock)
    for user in ("a", "b", "c"):
        assert cache.put(_entry(cache, user))
    assert cache.nbytes <= 2 * one and cache.evictions == 1
    assert cache.lookup(cache.key("a", "h")) is not None  # from the spill tier
    assert cache.spill_hits == 1 and cache.spill.nbytes == one  # "b" spilled in turn
    clock.now_s += 6.0
    assert cache.lookup(cache.key("b", "h")) is None  # spilled entries expire
    assert not cache.put(_entry(cache, "huge", tokens=1000))  # over the whole budget
    cache.check_invariants()


def test_int8_saves_bytes_and_scores_stay_close(tiny_loaded):
    f32, ds = make_ranker(tiny_loaded)
    q8, _ = make_ranker(tiny_loaded, int8=True)
    user = sorted(ds.users)[0]
    cands = sample_candidates(ds, 5, seed=0)
    a = f32.score(user, ds.users[user], cands).scores
    b = q8.score(user, ds.users[user], cands).scores
    assert q8.cache.nbytes < 0.3 * f32.cache.nbytes
    assert max(abs(x - y) for x, y in zip(a, b)) < 0.05
    q8.cache.check_invariants()


def test_singleflight_stampede_computes_once(tiny_loaded):
    ranker, ds = make_ranker(tiny_loaded)
    user = sorted(ds.users)[0]
    original = ranker._build
    def slow_build(*args):
        time.sleep(0.3)
        return original(*args)
    ranker._build = slow_build
    barrier = threading.Barrier(6)
    results = []
    def worker():
        barrier.wait()
        results.append(ranker.prefix(user, ds.users[user])[0])
    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ranker.full_computes == 1 and len(results) == 6
    assert all(torch.equal(r.k, results[0].k) for r in results)


def test_hit_rate_warning(caplog):
    cache = UserPrefixCache(PrefixCacheConfig(hit_rate_window=10), "fp", FakeClock())
    with caplog.at_level(logging.WARNING, logger="rcllm.userprefix.cache"):
        for i in range(10):
            cache.lookup(cache.key(f"u{i}", "h"))
    assert cache.hit_rate == 0.0
    assert any("below 70%" in r.message for r in caplog.records)


def test_bad_config_is_rejected():
    with pytest.raises(RcllmError):
        UserPrefixCache(PrefixCacheConfig(refresh_every=0), "fp")
