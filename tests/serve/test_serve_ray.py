"""The Ray deployment with 2 tiny-model instances: routing, catalog updates, a dead instance."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")

from rcllm.serve.app import create_app  # noqa: E402
from rcllm.serve.server import start_in_thread  # noqa: E402
from rcllm.serve.settings import ServeSettings  # noqa: E402
from rcllm.serve.spec import EngineSpec  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    from rcllm.serve.router import RayBackend

    spec = EngineSpec(overrides=(f"model.path={tiny_model_dir}", "model.threads=1"))
    backend = RayBackend(spec, num_instances=2, queue_size=4)
    running = start_in_thread(create_app(backend, ServeSettings(queue_size=4)))
    yield running.url, backend
    running.stop()      # closes the backend: kills the actors, shuts down Ray


def test_two_instances_rank_and_share_catalog_updates(cluster, rank_bodies):
    url, backend = cluster
    assert all(i.alive for i in backend.instances) and len(backend.instances) == 2
    # the placement splits the catalog: each instance starts with part of the item KV
    assert all(0 < len(i.cached) < len(backend.item_tokens) for i in backend.instances)
    with httpx.Client(base_url=url, timeout=60) as c:
        fetched = 0
        for body in rank_bodies[:3]:
            r = c.post("/v1/rank", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["instance"] in (0, 1)
            st = r.json()["stats"]
            fetched += st["fetched_items"]
            # every item is on some shard: held or fetched, so only history chunks can miss
            assert st["chunk_misses"] <= min(len(body["history"]), 10)
        assert fetched > 0      # items of the other shard came through the object store
        cands = rank_bodies[0]["candidates"]
        assert c.put("/v1/items", json={"items": [{"item_id": "ray-new", "title": "New"}]}) \
            .status_code == 202
        deadline = time.monotonic() + 30
        while c.get("/v1/items/ray-new").json().get("pending", True):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for _ in range(2):   # whichever instance serves it knows the item
            r = c.post("/v1/rank", json={**rank_bodies[0], "candidates": ["ray-new", *cands]})
            assert r.status_code == 200, r.text
        assert c.delete("/v1/items/ray-new").status_code == 204
        r = c.post("/v1/rank", json={**rank_bodies[0], "candidates": ["ray-new", *cands]})
        assert r.status_code == 400 and r.json()["error"]["field"] == "candidates"
        assert "rcllm_requests_total" in c.get("/metrics").text


def test_a_dead_instance_loses_no_request(cluster, rank_bodies):
    url, backend = cluster
    bodies = [rank_bodies[k % len(rank_bodies)] for k in range(8)]   # = the admission limit
    for k in (0, 1):            # both instances busy for 3 s: the 8 requests stay in flight
        backend.stall_instance(k, 3.0)
    with ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(httpx.post, f"{url}/v1/rank", json=b, timeout=120) for b in bodies]
        deadline = time.monotonic() + 10
        while backend.queue_depth() < 8 and time.monotonic() < deadline:
            time.sleep(0.005)
        # all 8 admitted (4 per instance at most), so instance 0 holds 4 in flight
        assert backend.instances[0].inflight == 4
        backend.kill_instance(0)
        codes = [f.result().status_code for f in futs]
    assert codes == [200] * 8
    assert not backend.instances[0].alive and backend.retries >= 1
    r = httpx.post(f"{url}/v1/rank", json=rank_bodies[0], timeout=60)
    assert r.status_code == 200 and r.json()["instance"] == 1
    assert httpx.get(f"{url}/readyz").status_code == 200
