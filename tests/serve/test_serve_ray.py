"""The Ray deployment with 2 tiny-model instances: routing, catalog updates, a dead instance."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import ray

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
    # the engines run at the server's priority, not Ray's default nice 15 for workers (which
    # starved them whenever another job shared the cores)
    assert backend.niceness() == [os.nice(0)] * 2
    # requests are priced with a profile fitted to the served (tiny, 3-layer) model
    assert backend.profile.name.endswith("@calibrated")
    assert backend.profile.model.num_layers == 3 and backend.cost.profile is backend.profile
    # the placement splits the catalog: each instance starts with part of the item KV
    assert all(0 < len(i.cached) < len(backend.item_tokens) for i in backend.instances)
    # the tiny model recomputes an item faster than a Ray round trip, so the cost model's
    # bound would let no export arrive in time: wait for them here
    backend.imports.wait_floor_ms = 5000.0
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
        # the time in the actor outside the engine's clock is reported; a full request reads
        # no item KV, so it imports none (an import can wait a second on a busy owner)
        assert {"import_wait_ms", "import_ms", "lock_wait_ms", "actor_ms"} <= set(st)
        assert st["actor_ms"] >= st["import_wait_ms"] + st["import_ms"] + st["lock_wait_ms"]
        for body in rank_bodies[3:6]:
            st = c.post("/v1/rank", json={**body, "method": "full"}).json()["stats"]
            assert st["fetched_items"] == 0 and st["import_wait_ms"] + st["import_ms"] < 50
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


def _burst(url, backend, bodies, stalls):
    """Stalls the instances for `stalls` seconds, sends `bodies` at once (each instance takes
    its queue of 4: 4 in flight on each), returns the responses."""
    for k, seconds in enumerate(stalls):
        backend.stall_instance(k, seconds)
    with ThreadPoolExecutor(len(bodies)) as pool:
        futs = [pool.submit(httpx.post, f"{url}/v1/rank", json=b, timeout=120) for b in bodies]
        deadline = time.monotonic() + 10
        while backend.queue_depth() < len(bodies) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [i.inflight for i in backend.instances] == [4, 4]
        return [f.result() for f in futs]


def test_a_timed_out_instance_is_probed_and_readmitted(cluster, rank_bodies):
    url, backend = cluster
    bodies = [rank_bodies[k % len(rank_bodies)] for k in range(8)]
    backend.health.call_timeout_s = 8.0
    try:    # instance 0 stuck: its 4 requests time out at 8 s and go to instance 1
        out = _burst(url, backend, bodies, (120.0, 2.5))
    finally:
        backend.health.call_timeout_s = 60.0
        if any(r.status_code != 200 for r in out):
            backend.unstall_instance(0)      # not to leave the next test a stuck instance
    assert [r.status_code for r in out] == [200] * 8
    assert {r.json()["instance"] for r in out} == {1}
    zero = backend.instances[0]
    assert zero.alive and zero.suspect and "timeout" in zero.failures    # suspect, not dead
    time.sleep(2 * backend.health.probe_interval_s + 1)
    assert zero.suspect and backend.health.readmitted == 0      # a stuck engine fails its probes
    assert httpx.get(f"{url}/readyz").status_code == 200
    backend.unstall_instance(0)
    deadline = time.monotonic() + 30
    while zero.suspect:     # the probe finds its engine free once the stall is over
        assert time.monotonic() < deadline, "instance 0 was never re-admitted"
        time.sleep(0.2)
    assert backend.health.readmitted >= 1
    out = _burst(url, backend, bodies, (2.5, 2.5))       # it takes requests again
    assert [r.status_code for r in out] == [200] * 8
    assert [r.json()["instance"] for r in out].count(0) == 4


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
