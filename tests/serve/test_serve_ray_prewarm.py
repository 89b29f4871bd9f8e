"""Prewarm in the Ray deployment (2 tiny pointwise instances): the prewarm and the user's next
ranking land on the same instance, and the ranking hits the user side computed there."""

from __future__ import annotations

import httpx
import pytest

import ray

from rcllm.serve.app import create_app  # noqa: E402
from rcllm.serve.server import start_in_thread  # noqa: E402
from rcllm.serve.settings import ServeSettings  # noqa: E402
from rcllm.serve.spec import EngineSpec  # noqa: E402


@pytest.fixture(scope="module")
def pointwise_cluster(tiny_model_dir):
    from rcllm.serve.router import RayBackend

    spec = EngineSpec(overrides=(f"model.path={tiny_model_dir}", "model.threads=1"),
                      scorer="pointwise")
    backend = RayBackend(spec, num_instances=2, queue_size=4)
    running = start_in_thread(create_app(backend, ServeSettings(queue_size=4)))
    yield running.url, backend
    running.stop()


def test_prewarm_and_rank_meet_on_one_instance(pointwise_cluster, rank_bodies):
    url, backend = pointwise_cluster
    assert backend.residency is not None
    with httpx.Client(base_url=url, timeout=120) as c:
        for body in rank_bodies[:4]:
            user = {"user_id": body["user_id"], "history": body["history"]}
            pre = c.post("/v1/prewarm", json=user)
            assert pre.status_code == 200, pre.text
            home = pre.json()["instance"]
            assert pre.json()["computed"] is True
            held = ray.get([a.holds_user_prefix.remote(body["user_id"]) for a in backend.actors])
            assert held == [k == home for k in range(2)]
            r = c.post("/v1/rank", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["instance"] == home
            assert r.json()["stats"]["user_prefix"] == "hit"
        text = c.get("/metrics").text
    assert "rcllm_userprefix_hits_total 4.0" in text
    assert 'rcllm_prewarm_total{result="computed"} 4.0' in text
    assert 'rcllm_kv_tier_hits_total{tier="memory"}' in text


def test_an_instance_killed_under_load_loses_no_request(pointwise_cluster, rank_bodies):
    """3 closed-loop clients rank continuously (never more than 3 in flight: no 429); the
    instance they load is stalled, so requests are in flight on it, and killed mid-load."""
    import threading
    import time

    url, backend = pointwise_cluster
    codes: list[int] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            for n in range(10):
                r = c.post("/v1/rank", json=rank_bodies[(k + n) % len(rank_bodies)])
                with lock:
                    codes.append(r.status_code)

    workers = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for w in workers:
        w.start()
    while len(codes) < 3:                       # the load is running
        time.sleep(0.01)
    victim = max(backend.instances, key=lambda i: i.served).index
    backend.stall_instance(victim, 10.0)
    deadline = time.monotonic() + 20
    while backend.instances[victim].inflight < 1:
        assert time.monotonic() < deadline, "no request reached the stalled instance"
        time.sleep(0.005)
    retries = backend.retries
    backend.kill_instance(victim)
    for w in workers:
        w.join(timeout=120)
    assert codes == [200] * 30
    assert not backend.instances[victim].alive and backend.retries > retries
