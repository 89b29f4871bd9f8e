"""The Ray router's choice with user-prefix residency (no Ray needed): the instance holding the
user's user side wins the policy's locality term, so a prewarm and the next ranking meet."""

from __future__ import annotations

from rcllm.routing import CostModel, MethodConfig, cpu_smollm2_profile, routing_policy
from rcllm.serve.views import (LiveInstance, UserResidency, cluster_view, routing_request,
                               user_key)

TOKENS = {f"i{k}": 40 for k in range(8)}
HISTORY = [{"item_id": f"h{k}", "rating": 4, "review": "", "timestamp": k} for k in range(6)]


def _choose(policy: str, instances, payload, residency: UserResidency | None) -> int:
    profile = cpu_smollm2_profile()
    pol = routing_policy(policy, CostModel(profile, MethodConfig()))
    request = routing_request(payload, TOKENS, user_side=residency is not None)
    home = (residency.home(payload["user_id"], payload["history"]) if residency is not None
            else None)
    view = cluster_view(instances, profile, payload["user_id"] if home is not None else None,
                        home)
    return instances[pol.choose(request, view)].index


def _cluster():
    # instance 0 holds slightly more of the candidates' item KV than instance 1
    return [LiveInstance(0, {"i0", "i1", "i2", "i3", "i4"}),
            LiveInstance(1, {"i5", "i6", "i7"})]


def test_rank_follows_the_resident_user_side():
    payload = {"user_id": "u1", "history": HISTORY, "candidates": list(TOKENS)}
    for policy in ("affinity", "hit-only", "cost"):
        # no residency: the item shards decide
        assert _choose(policy, _cluster(), payload, None) == 0, policy
        assert _choose(policy, _cluster(), payload, UserResidency(300)) == 0, policy
        # the user side lives on instance 1 (prewarmed there): it now outweighs 2 item chunks
        homes = UserResidency(300)
        homes.note("u1", 1)
        assert _choose(policy, _cluster(), payload, homes) == 1, policy
        # another user is unaffected
        assert _choose(policy, _cluster(), {**payload, "user_id": "u2"}, homes) == 0, policy


def test_prewarm_goes_home_or_by_load():
    prewarm = {"user_id": "u1", "history": HISTORY, "candidates": []}
    homes = UserResidency(300)
    cluster = _cluster()
    cluster[0].started(500.0)              # instance 0 busy: an unknown user goes to 1
    assert _choose("affinity", cluster, prewarm, homes) == 1
    homes.note("u1", 0)                    # ... but a resident user side pulls it home
    assert _choose("affinity", cluster, prewarm, homes) == 0


def test_residency_expires_and_is_bounded():
    now = [0.0]
    homes = UserResidency(10.0, max_users=2, clock=lambda: now[0])
    homes.note("a", 0)
    homes.note("b", 1)
    homes.note("c", 1)                     # over max_users: the oldest ("a") is dropped
    assert homes.home("a") is None and homes.home("b") == 1 and len(homes) == 2
    now[0] = 11.0
    assert homes.home("b") is None         # past the cache's longest TTL
    homes.note("d", 1)
    homes.forget_instance(1)               # its instance died
    assert homes.home("d") is None and len(homes) == 0


def test_user_side_is_one_routing_item_never_a_catalog_id():
    req = routing_request({"user_id": "i0", "history": HISTORY, "candidates": ["i0"]}, TOKENS,
                          user_side=True)
    assert list(req.items) == [user_key("i0"), "i0"]
    assert req.shape.item_tokens == int(req.item_tokens.sum())
    assert user_key("i0") not in {"i0"}


def test_a_resident_side_pulls_only_the_requests_it_can_serve():
    """The engine reuses a user side for the same window (hit) or one the new window extends
    (append); when the window slid, the resident side serves nothing, and the router must not
    send the request to a busier instance for it."""
    homes = UserResidency(300, history_window=4)
    homes.note("u1", 1, HISTORY[:3])                       # built from reviews 0..2
    same = {"user_id": "u1", "history": HISTORY[:3], "candidates": list(TOKENS)}
    grown = {**same, "history": HISTORY[:4]}                # 0..3: an append
    slid = {**same, "history": HISTORY[:6]}                 # window 2..5: nothing reusable
    edited = {**same, "history": [{**HISTORY[0], "rating": 1}, *HISTORY[1:4]]}
    assert homes.home("u1", same["history"]) == 1
    assert homes.home("u1", grown["history"]) == 1
    assert homes.home("u1", slid["history"]) is None
    assert homes.home("u1", edited["history"]) is None
    assert homes.home("u1") == 1                            # without a history: where it lives
    for policy in ("affinity", "hit-only", "cost"):
        assert _choose(policy, _cluster(), grown, homes) == 1, policy
        assert _choose(policy, _cluster(), slid, homes) == 0, policy   # the item shards decide
    # the window itself slides once it is full: a side built from 2..5 serves 2..5 only
    homes.note("u1", 1, HISTORY)
    assert homes.home("u1", HISTORY) == 1
    assert homes.home("u1", [*HISTORY, {**HISTORY[0], "item_id": "h9"}]) is None


def test_no_object_store_import_beside_a_shared_redis_tier():
    """With Redis every instance's chunks are shared already; an import would only wait on
    the owner's engine lock (up to 1 s: the sweep's rare slow reuse requests)."""
    from rcllm.serve.imports import imports_item_kv
    from rcllm.serve.spec import EngineSpec

    assert imports_item_kv(EngineSpec())
    assert not imports_item_kv(EngineSpec(), fetch_remote=False)
    assert not imports_item_kv(EngineSpec(redis_url="redis://127.0.0.1:6379/0"))


def test_a_shared_tier_makes_every_item_it_holds_local_everywhere():
    from rcllm.serve.views import live_instances

    held = [["i0", "i1", "i2", "i3", "i4"], ["i5", "i6", "i7"]]
    own = live_instances(held)
    assert "i5" not in own[0].cached and "i0" not in own[1].cached
    payload = {"user_id": "u1", "history": HISTORY, "candidates": list(TOKENS)}
    assert _choose("hit-only", own, payload, None) == 0        # instance 0 holds more
    tier = {*held[0], *held[1]}                                 # what the tier holds
    shared = live_instances(held, tier)
    assert all(tier <= set(i.view(None).cached_items) for i in shared)
    tier.add("new")                                             # served on 1: read by 0 too
    assert "new" in shared[0].view(None).cached_items
    assert "new" not in shared[0].cached                        # not in 0's own memory
    shared[0].started(500.0)                                   # instance 0 busy
    for policy in ("affinity", "hit-only", "cost"):            # items no longer pull to 0
        assert _choose(policy, shared, payload, None) == 1, policy


def test_an_item_the_tier_evicted_pulls_towards_the_instance_whose_memory_holds_it():
    from rcllm.serve.views import live_instances

    tier = set(TOKENS)
    held = [[], list(TOKENS)[:6]]                      # instance 1's own memory: 6 items
    inst = live_instances(held, tier)
    payload = {"user_id": "u1", "history": HISTORY, "candidates": list(TOKENS)}
    assert inst[0].tier is inst[1].tier                 # one picture for every instance
    inst[0].started(10.0)
    inst[0].finished(10.0, 12.0, [])
    # everything in the tier: local everywhere, so no pull (a tie goes to the first)
    assert _choose("hit-only", inst, payload, None) == 0
    tier.difference_update(list(TOKENS)[:6])           # evicted from the tier
    assert _choose("hit-only", inst, payload, None) == 1
    for policy in ("affinity", "cost"):
        assert _choose(policy, inst, payload, None) == 1, policy
