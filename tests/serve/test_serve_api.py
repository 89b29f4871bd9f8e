"""The HTTP API end to end over loopback with the tiny model: ranking, errors, limits."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from rcllm.serve.app import create_app
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings


def test_rank_end_to_end(client, rank_bodies):
    body = rank_bodies[0]
    r = client.post("/v1/rank", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert sorted(out["ranking"]) == sorted(body["candidates"])
    assert set(out["scores"]) == set(body["candidates"])
    scores = [out["scores"][c] for c in out["ranking"]]
    assert scores == sorted(scores, reverse=True)
    assert out["ttft_ms"] > 0 and out["method"] == "rcllm"
    st = out["stats"]
    assert st["tokens"] > 0 and 0 < st["recomputed_fraction"] <= 1
    assert {"chunk_hits", "chunk_misses", "reused_tokens"} <= set(st)


def test_overrides_reach_the_engine(client, rank_bodies):
    body = rank_bodies[1]
    client.post("/v1/rank", json={**body, "method": "naive"})       # misses get cached
    naive = client.post("/v1/rank", json={**body, "method": "naive"}).json()
    assert naive["method"] == "naive" and naive["stats"]["chunk_misses"] == 0
    one = client.post("/v1/rank", json={**body, "item_ratio": 1.0, "history_ratio": 1.0}).json()
    assert one["stats"]["recomputed_fraction"] > 0.9 > naive["stats"]["recomputed_fraction"]
    full = client.post("/v1/rank", json={**body, "method": "full"}).json()
    assert full["method"] == "full" and full["stats"]["recomputed_fraction"] == 1.0


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_bad_input_names_the_field(client, rank_bodies):
    body = rank_bodies[0]
    assert _error(client.post("/v1/rank", json={"user_id": "u"}), 422)["field"] == "candidates"
    bad = {**body, "history": [{**body["history"][0], "rating": 7}]}
    assert _error(client.post("/v1/rank", json=bad), 422)["field"] == "history.0.rating"
    assert _error(client.post("/v1/rank", json={**body, "method": "x"}), 422)["field"] == "method"
    assert _error(client.post("/v1/rank", json={**body, "item_ratio": 2}), 422)["field"] \
        == "item_ratio"
    err = _error(client.post("/v1/rank", json={**body, "candidates": ["nope", "x"]}), 400)
    assert err["field"] == "candidates" and "nope" in err["message"]
    dup = [body["candidates"][0]] * 2
    assert _error(client.post("/v1/rank", json={**body, "candidates": dup}), 422)["field"] \
        == "candidates"
    many = [f"i{k}" for k in range(21)]
    assert _error(client.post("/v1/rank", json={**body, "candidates": many}), 422)["field"] \
        == "candidates"
    assert _error(client.post("/v1/rank", content=b"{not json",
                              headers={"content-type": "application/json"}), 422)
    huge = b"x" * (65 << 10)
    assert _error(client.post("/v1/rank", content=huge), 413)["field"] == "body"
    assert _error(client.get("/v1/nowhere"), 404)


def test_overload_answers_429_and_admitted_requests_finish(served, rank_bodies):
    url, backend = served
    body = rank_bodies[2]
    pool = ThreadPoolExecutor(2)
    backend.host.lock.acquire()                      # the engine is busy
    try:
        admitted = [pool.submit(httpx.post, f"{url}/v1/rank", json=body, timeout=60)
                    for _ in range(2)]
        deadline = time.monotonic() + 10
        while backend.queue_depth() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = httpx.post(f"{url}/v1/rank", json=body, timeout=10)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["field"] == "request"
    finally:
        backend.host.lock.release()
        pool.shutdown(wait=False)
    assert [f.result().status_code for f in admitted] == [200, 200]
    assert backend.queue_depth() == 0


def _wait_built(client, item_id: str) -> dict:
    deadline = time.monotonic() + 20
    while True:
        r = client.get(f"/v1/items/{item_id}")
        if r.status_code == 200 and not r.json()["pending"]:
            return r.json()
        assert time.monotonic() < deadline, f"item {item_id} never became visible"
        time.sleep(0.05)


def test_items_put_and_delete_are_seen_by_later_requests(client, rank_bodies):
    body = {**rank_bodies[3], "method": "naive"}
    cands = body["candidates"]
    client.post("/v1/rank", json=body)                           # warm history + items
    assert _error(client.post("/v1/rank", json={**body, "candidates": ["new-1", *cands[1:]]}),
                  400)["field"] == "candidates"
    r = client.put("/v1/items", json={"items": [
        {"item_id": "new-1", "title": "A brand new item", "description": "never seen before"},
        {"item_id": cands[0], "title": "Renamed item", "description": "updated text"}]})
    assert r.status_code == 202 and r.json()["accepted"] == ["new-1", cands[0]]
    assert _wait_built(client, "new-1")["title"] == "A brand new item"
    assert _wait_built(client, cands[0])["title"] == "Renamed item"
    out = client.post("/v1/rank", json={**body, "candidates": ["new-1", *cands]})
    assert out.status_code == 200, out.text
    # built before the swap: the new and the renamed item are hits, not misses
    assert out.json()["stats"]["chunk_misses"] == 0
    assert client.delete("/v1/items/new-1").status_code == 204
    assert client.get("/v1/items/new-1").status_code == 404
    assert client.delete("/v1/items/new-1").status_code == 404
    assert _error(client.post("/v1/rank", json={**body, "candidates": ["new-1", *cands[1:]]}),
                  400)["field"] == "candidates"
    assert _error(client.put("/v1/items", json={"items": [{"item_id": "z"}]}), 422)["field"] \
        == "items.0.title"


def test_health_metrics_and_token(served, client, rank_bodies):
    assert client.get("/healthz").json() == {"ok": True, "untuned": False, "note": None}
    assert client.get("/readyz").json()["ready"] is True
    client.post("/v1/rank", json=rank_bodies[0])
    text = client.get("/metrics").text
    for name in ("rcllm_requests_total", "rcllm_ttft_seconds_bucket", "rcllm_chunk_hit_ratio",
                 "rcllm_queue_depth", "rcllm_recomputed_fraction_bucket",
                 "rcllm_rejected_total", "rcllm_chunk_lookups_total", "rcllm_reused_tokens_total"):
        assert name in text, name
    assert 'rcllm_requests_total{endpoint="/v1/rank",status="200"}' in text
    _url, backend = served
    locked = start_in_thread(create_app(backend, ServeSettings(token="s3cret"), own_backend=False))
    try:
        assert httpx.get(f"{locked.url}/healthz").status_code == 200
        assert httpx.post(f"{locked.url}/v1/rank", json=rank_bodies[0]).status_code == 401
        ok = httpx.post(f"{locked.url}/v1/rank", json=rank_bodies[0], timeout=60,
                        headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
    finally:
        locked.stop()


def test_an_untuned_server_says_so(served):
    """Without an adapter the rankings are the base model's: /healthz and the page's user list
    carry the note (the start-up log prints it: commands/serve.py)."""
    from fastapi.testclient import TestClient

    from rcllm.report import UNTUNED_NOTE

    app = create_app(served[1], ServeSettings(queue_size=2), own_backend=False, untuned=True)
    with TestClient(app) as c:
        health = c.get("/healthz").json()
        assert health["untuned"] is True and health["note"] == UNTUNED_NOTE
        page = c.get("/v1/ui/users").json()
        assert page["untuned"] is True and "ranks untuned" in page["note"]
        assert 'id="untuned"' in c.get("/ui").text
