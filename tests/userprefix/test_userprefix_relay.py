"""Pre-inference relay: trigger admission, footprint bound, affinity routing, bad input."""

from __future__ import annotations

import pytest
from up_helpers import make_ranker

from rcllm.errors import RcllmError
from rcllm.userprefix.relay import AffinityRouter, Relay, RelayConfig, Trigger
from rcllm.bench.userprefix_workload import long_history, sample_candidates


def test_trigger_rules():
    trig = Trigger(RelayConfig(min_prefix_tokens=100, max_cache_bytes=1000, max_inflight=1))
    assert trig.decide(50, 10, 0, 0).reason == "short"
    assert trig.decide(200, 600, 500, 0).reason == "footprint"
    assert trig.decide(200, 100, 500, 1).reason == "load"
    assert trig.decide(200, 100, 500, 0).admitted
    with pytest.raises(RcllmError):
        Trigger(RelayConfig(min_prefix_tokens=10, max_prefix_tokens=5))


def test_affinity_routing_is_stable_and_spread():
    router = AffinityRouter(["i0", "i1", "i2", "i3"])
    users = [f"u{i}" for i in range(400)]
    first = [router.route(u) for u in users]
    assert first == [AffinityRouter(["i0", "i1", "i2", "i3"]).route(u) for u in users]
    assert all(first.count(name) > 60 for name in router.instances)
    grown = AffinityRouter(["i0", "i1", "i2", "i3", "i4"])
    moved = [u for u, a in zip(users, first) if grown.route(u) != a]
    assert all(grown.route(u) == "i4" for u in moved)  # only users of the new instance move
    assert len(moved) < 130


def _relay(tiny_loaded, cfg: RelayConfig, instances: int = 2):
    rankers, ds = {}, None
    for i in range(instances):
        rankers[f"i{i}"], ds = make_ranker(tiny_loaded)
    prompt = rankers["i0"].prompt
    users = {u: long_history(prompt, h, 400) for u, h in sorted(ds.users.items())}
    users["short"] = ds.users[sorted(ds.users)[0]][:1]
    return Relay(rankers, users, cfg), ds


def test_prewarm_then_rank_hits_on_the_same_instance(tiny_loaded):
    relay, ds = _relay(tiny_loaded, RelayConfig(min_prefix_tokens=200))
    user = sorted(ds.users)[0]
    adm = relay.prewarm(user)
    assert adm.admitted and adm.instance == relay.router.route(user)
    assert relay.prewarm(user).reason == "cached"
    name, scored = relay.rank(user, sample_candidates(ds, 4, seed=0))
    assert name == adm.instance and scored.cached
    cache = relay.instances[name].cache
    assert (cache.hits, cache.misses) == (1, 0)  # the prewarm does not count as a miss
    assert relay.prewarm("short").reason == "short"


def test_bad_prewarm_input(tiny_loaded):
    relay, ds = _relay(tiny_loaded, RelayConfig(min_prefix_tokens=10, max_prefix_tokens=300))
    with pytest.raises(RcllmError, match="unknown user"):
        relay.prewarm("nobody")
    with pytest.raises(RcllmError, match="over the relay limit"):
        relay.prewarm(sorted(ds.users)[0])  # a ~400-token user side


def test_footprint_bound_enforced(tiny_loaded):
    per_user = 2 * 3 * 2 * 16 * 4 * 420  # K+V × layers × kv heads × head dim × fp32 × tokens
    relay, ds = _relay(tiny_loaded, RelayConfig(min_prefix_tokens=100,
                                                max_cache_bytes=3 * per_user), instances=1)
    reasons = [relay.prewarm(u).reason for u in sorted(ds.users)]
    cache = relay.instances["i0"].cache
    assert "footprint" in reasons and reasons.count("admitted") <= 3
    assert cache.nbytes <= 3 * per_user
    cache.check_invariants()


def test_preinference_load_bound(tiny_loaded):
    import threading
    import time

    relay, ds = _relay(tiny_loaded, RelayConfig(min_prefix_tokens=100, max_inflight=1),
                       instances=1)
    ranker = relay.instances["i0"]
    original = ranker._build
    started = threading.Event()

    def slow_build(*args):
        started.set()
        time.sleep(0.5)
        return original(*args)

    ranker._build = slow_build
    users = sorted(ds.users)
    first = threading.Thread(target=relay.prewarm, args=(users[0],))
    first.start()
    assert started.wait(5.0)
    assert relay.prewarm(users[1]).reason == "load"  # one pre-inference already in flight
    first.join()
    assert relay.decisions == {"admitted": 1, "load": 1}


def test_rank_rejects_unknown_input(tiny_loaded):
    relay, ds = _relay(tiny_loaded, RelayConfig(min_prefix_tokens=100))
    with pytest.raises(RcllmError, match="unknown user"):
        relay.rank("nobody", sample_candidates(ds, 2, seed=0))
    with pytest.raises(RcllmError, match="unknown candidate"):
        relay.rank(sorted(ds.users)[0], ["no-such-item"])
