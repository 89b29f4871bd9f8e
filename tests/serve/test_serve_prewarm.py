"""POST /v1/prewarm (RelayGR pre-inference) through HTTP on a pointwise engine: the user side is
computed ahead, the user's next ranking hits the user-prefix cache, and /metrics shows it."""

from __future__ import annotations

import httpx
import pytest

from rcllm.launch import make_stored_engine
from rcllm.config import RcllmConfig, load
from rcllm.serve.app import create_app
from rcllm.serve.local import LocalBackend
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings


@pytest.fixture(scope="module")
def pointwise_url(tiny_model_dir, synthetic, tmp_path_factory):
    """A pointwise engine as `rcllm serve` builds it (memory for items and reviews, a disk
    tier) behind a real HTTP server."""
    cfg = load(RcllmConfig, None, [f"model.path={tiny_model_dir}", "model.threads=1"])
    engine = make_stored_engine(cfg, dict(synthetic.items), "pointwise",
                                tmp_path_factory.mktemp("kv"), history_bytes=64 << 20)
    running = start_in_thread(create_app(LocalBackend(engine, queue_size=2), ServeSettings()))
    yield running.url
    running.stop()


def _metric(text: str, name: str) -> float:
    rows = [line for line in text.splitlines() if line.startswith(name + " ")]
    assert rows, f"{name} missing from /metrics"
    return float(rows[0].split()[-1])


def test_prewarm_then_rank_hits_the_user_prefix(pointwise_url, rank_bodies):
    body = rank_bodies[0]
    user = {"user_id": body["user_id"], "history": body["history"]}
    with httpx.Client(base_url=pointwise_url, timeout=120) as c:
        cold = c.post("/v1/rank", json={**rank_bodies[1]})   # another user: a miss
        assert cold.status_code == 200, cold.text
        assert cold.json()["stats"]["user_prefix"] == "miss"
        r = c.post("/v1/prewarm", json=user)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["computed"] is True and out["tokens"] > 0 and out["instance"] == 0
        again = c.post("/v1/prewarm", json=user).json()
        assert again["computed"] is False and again["tokens"] == out["tokens"]
        ranked = c.post("/v1/rank", json=body)
        assert ranked.status_code == 200, ranked.text
        st = ranked.json()["stats"]
        assert st["user_prefix"] == "hit"
        assert st["user_prefix_tokens"] == out["tokens"]
        text = c.get("/metrics").text
    assert _metric(text, "rcllm_userprefix_hits_total") == 1.0     # prewarm lookups not counted
    assert _metric(text, "rcllm_userprefix_misses_total") == 1.0
    assert _metric(text, "rcllm_userprefix_entries") == 2.0
    assert _metric(text, "rcllm_userprefix_bytes") > 0
    assert 'rcllm_prewarm_total{result="computed"} 1.0' in text
    assert 'rcllm_prewarm_total{result="cached"} 1.0' in text


def test_prewarm_is_refused_without_the_pointwise_scorer(client, rank_bodies):
    body = rank_bodies[0]
    r = client.post("/v1/prewarm", json={"user_id": body["user_id"],
                                         "history": body["history"]})
    assert r.status_code == 400
    assert "pointwise" in r.json()["error"]["message"]
    bad = client.post("/v1/prewarm", json={"user_id": "", "history": []})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "user_id"
    # the verbalizer deployment has no user-prefix cache: no user-prefix series at all
    assert "rcllm_userprefix_hits_total" not in client.get("/metrics").text


def test_grafana_dashboard_reads_only_exported_metrics(pointwise_url, rank_bodies):
    """docs/grafana-rcllm-serve.json: every series a panel queries is in this server's
    /metrics (errors_total exists only on a Redis tier)."""
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "grafana-rcllm-serve.json"
    dash = json.loads(path.read_text())
    names = {n for p in dash["panels"] for t in p["targets"]
             for n in re.findall(r"\brcllm_[a-z0-9_]+", t["expr"])}
    with httpx.Client(base_url=pointwise_url, timeout=120) as c:
        assert c.post("/v1/rank", json=rank_bodies[2]).status_code == 200
        exported = {line.split("{")[0].split()[0]
                    for line in c.get("/metrics").text.splitlines()
                    if line.startswith("rcllm_")}
    assert len(names) >= 20
    assert names - exported <= {"rcllm_kv_tier_errors_total"}, names - exported
