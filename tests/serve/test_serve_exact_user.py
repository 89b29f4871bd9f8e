"""`exact-user` served: one deployment serves it beside the adapter's fast path (a per-request
method), a prewarmed user side is reused exactly, and the ranking equals full's."""

from __future__ import annotations

import httpx
import pytest

from rcllm.config import RcllmConfig, load
from rcllm.launch import make_stored_engine
from rcllm.serve.app import create_app
from rcllm.serve.local import LocalBackend
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings


@pytest.fixture(scope="module")
def late_url(tiny_model_dir, synthetic, tmp_path_factory):
    """A pointwise engine whose own method is late@1 (as an adapter's fast path would be)."""
    cfg = load(RcllmConfig, None, [f"model.path={tiny_model_dir}", "model.threads=1",
                                   "reuse.method=late", "reuse.late_layer=1"])
    engine = make_stored_engine(cfg, dict(synthetic.items), "pointwise",
                                tmp_path_factory.mktemp("kv"), history_bytes=64 << 20)
    running = start_in_thread(create_app(LocalBackend(engine, queue_size=2), ServeSettings()))
    yield running.url
    running.stop()


def test_prewarmed_exact_user_equals_full_beside_the_fast_path(late_url, rank_bodies):
    body = rank_bodies[2]
    with httpx.Client(base_url=late_url, timeout=120) as c:
        full = c.post("/v1/rank", json={**body, "method": "full"}).json()
        assert c.post("/v1/prewarm", json={"user_id": body["user_id"],
                                           "history": body["history"]}).status_code == 200
        got = c.post("/v1/rank", json={**body, "method": "exact-user"})
        assert got.status_code == 200, got.text
        out = got.json()
        fast = c.post("/v1/rank", json=body).json()   # the deployment's own method
    assert out["method"] == "exact-user" and fast["method"] == "late"
    assert out["stats"]["user_prefix"] == "hit"
    assert out["ranking"] == full["ranking"]
    for item, score in full["scores"].items():
        assert out["scores"][item] == pytest.approx(score, abs=1e-4)


def test_the_listwise_server_refuses_it_and_names_prefix(client, rank_bodies):
    r = client.post("/v1/rank", json={**rank_bodies[0], "method": "exact-user"})
    assert r.status_code == 400, r.text
    assert "'prefix'" in r.json()["error"]["message"]
