"""Prewarm in the Ray deployment (2 tiny pointwise instances): the prewarm and the user's next
ranking land on the same instance, and the ranking hits the user side computed there."""

from __future__ import annotations

import httpx
import pytest

ray = pytest.importorskip("ray")

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
