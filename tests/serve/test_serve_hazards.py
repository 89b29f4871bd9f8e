"""Issue 17 hazards in the server: the event loop never waits on the engine, unknown deletes
leave no state behind, 405 names every method, client reviews cannot evict catalog items."""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import httpx
import pytest

from rcllm.launch import make_stored_engine
from rcllm.config import ModelConfig, RcllmConfig, ReuseConfig
from rcllm.serve.app import create_app
from rcllm.serve.host import EngineHost
from rcllm.serve.local import LocalBackend
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings


@pytest.fixture
def paused(tiny_loaded, synthetic):
    """(url, backend, release): a server whose engine.rank waits for `release` once entered,
    holding the engine lock like a long ranking."""
    from rcllm.engine import Engine

    engine = Engine(tiny_loaded, dict(synthetic.items), RcllmConfig())
    entered, release = threading.Event(), threading.Event()
    real = engine.rank

    def slow_rank(*a, **kw):
        entered.set()
        release.wait(30)
        return real(*a, **kw)

    engine.rank = slow_rank
    backend = LocalBackend(engine, queue_size=2)
    running = start_in_thread(create_app(backend, ServeSettings(queue_size=2)))
    yield running.url, backend, entered, release
    release.set()
    running.stop()


def test_healthz_answers_while_a_ranking_holds_the_engine(paused, rank_bodies):
    url, backend, entered, release = paused
    item = next(iter(backend.host.catalog))
    answers: dict[str, int] = {}

    def call(name, method, path, **kw):
        answers[name] = httpx.request(method, url + path, timeout=60, **kw).status_code

    threads = [threading.Thread(target=call, args=("rank", "POST", "/v1/rank"),
                                kwargs={"json": rank_bodies[0]})]
    threads[0].start()
    assert entered.wait(30)                      # the ranking runs and holds the engine lock
    threads.append(threading.Thread(target=call, args=("delete", "DELETE", f"/v1/items/{item}")))
    threads[1].start()                           # waits for the engine lock
    time.sleep(0.3)
    with httpx.Client(base_url=url, timeout=2.0) as c:   # a blocked event loop times these out
        t0 = time.perf_counter()
        assert c.get("/healthz").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert c.get("/v1/items/unknown-id").status_code == 404
        assert time.perf_counter() - t0 < 2.0
    assert "delete" not in answers and "rank" not in answers   # both still waiting
    release.set()
    for t in threads:
        t.join(60)
    assert answers == {"rank": 200, "delete": 204}


def test_unknown_deletes_leave_no_state(client, served):
    _url, backend = served
    host: EngineHost = backend.host
    for i in range(200):
        assert client.delete(f"/v1/items/nope-{i}").status_code == 404
    for i in range(20_000):
        assert host.delete_item(f"never-{i}") is False
    assert host._latest == {} and host.pending() == 0
    # a PUT then its build: the version map empties again once the item is live
    assert client.put("/v1/items", json={"items": [{"item_id": "tmp-1", "title": "T"}]}) \
        .status_code == 202
    deadline = time.monotonic() + 30
    while host.pending():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert host._latest == {} and client.delete("/v1/items/tmp-1").status_code == 204
    assert host._latest == {} and client.get("/v1/items/tmp-1").status_code == 404


def test_405_lists_every_method_of_the_path(client):
    r = client.patch("/v1/items/some-id")
    assert r.status_code == 405
    allowed = {m.strip() for m in r.headers["allow"].split(",")}
    assert {"GET", "DELETE"} <= allowed and "PATCH" not in allowed
    assert r.json()["error"]["field"] == "request"
    r = client.get("/v1/rank")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_client_reviews_cannot_evict_catalog_items(tiny_model_dir, synthetic, rank_bodies):
    model = ModelConfig(path=str(tiny_model_dir), threads=0)
    probe = make_stored_engine(dataclasses.replace(RcllmConfig(), model=model),
                               dict(synthetic.items))
    probe.build_items(list(synthetic.items))
    items_bytes = probe.store.nbytes            # exactly what the whole catalog needs
    cfg = RcllmConfig(model=model, reuse=ReuseConfig(store_bytes=items_bytes))
    engine = make_stored_engine(cfg, dict(synthetic.items), history_bytes=items_bytes // 20)
    host = EngineHost(engine)
    try:
        host.build_items(list(synthetic.items))
        assert len(host.cached_items()) == len(synthetic.items)
        rng = random.Random(0)
        for n in range(12):                     # fresh, long reviews from clients
            body = dict(rank_bodies[n % len(rank_bodies)])
            body["history"] = [{**h, "review": " ".join(rng.choice(["good", "bad", "fine",
                                                                    "odd", "long"])
                                                        for _ in range(60))}
                               for h in body["history"]]
            host.rank({**body, "method": "naive"})
        engine.store.flush()                    # the reviews' KV is built behind the answers
        assert len(host.cached_items()) == len(synthetic.items)
        history = engine.store.inner.partitions["history"]
        assert history.evictions > 0 and history.nbytes <= items_bytes // 20
    finally:
        host.close()


def test_corrupt_disk_entry_is_recomputed_and_counted_in_metrics(tiny_model_dir, synthetic,
                                                                 rank_bodies, tmp_path):
    from rcllm.kvstore.wiring import close_store

    cfg = RcllmConfig(model=ModelConfig(path=str(tiny_model_dir), threads=0))
    kv = tmp_path / "kv"
    builder = make_stored_engine(cfg, dict(synthetic.items), kv_dir=kv)
    body = {**rank_bodies[1], "method": "naive"}
    builder.build_items(body["candidates"])
    close_store(builder.store)                   # on disk; its slot is free again
    entry = sorted(kv.rglob("*.rckv"))[0]
    entry.write_bytes(entry.read_bytes()[:-9])   # a torn write
    engine = make_stored_engine(cfg, dict(synthetic.items), kv_dir=kv,
                                history_bytes=64 << 20)
    backend = LocalBackend(engine, queue_size=2)
    running = start_in_thread(create_app(backend, ServeSettings(queue_size=2)))
    try:
        with httpx.Client(base_url=running.url, timeout=60) as c:
            out = c.post("/v1/rank", json=body).json()
            n_items = len(body["candidates"])
            assert out["stats"]["reused_tokens"]["item"] > 0
            text = c.get("/metrics").text
            assert 'rcllm_kv_tier_corrupt_total{tier="disk"} 1.0' in text
            assert f'rcllm_kv_tier_hits_total{{tier="disk"}} {n_items - 1}.0' in text
            assert 'rcllm_kv_tier_bytes{tier="memory-history"}' in text
            # per-tier latency and per-kind counters (the disk tier's split by kind)
            lookups = out["stats"]["chunk_hits"] + out["stats"]["chunk_misses"]
            for tier in ("all", "disk"):             # every lookup missed memory
                assert f'rcllm_kv_tier_get_seconds_count{{tier="{tier}"}} {lookups}.0' in text
                assert f'rcllm_kv_tier_get_seconds_bucket{{le="+Inf",tier="{tier}"}}' in text
            assert f'rcllm_kv_tier_kind_hits_total{{kind="item",tier="disk"}} {n_items - 1}.0' \
                in text
            assert f'rcllm_cache_hits_total{{kind="item"}} {n_items - 1}.0' in text
            assert 'rcllm_cache_misses_total{kind="history"}' in text
            engine.store.flush()                 # the recomputed chunk is stored again
            assert len(engine.store.inner.lower[0]) >= n_items
            again = c.post("/v1/rank", json=body).json()
            assert again["stats"]["chunk_misses"] == 0
    finally:
        running.stop()
