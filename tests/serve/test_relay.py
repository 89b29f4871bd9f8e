"""A relay in the served sweep (issue 60 item 3), without Ray: the open-loop client sends each
ranking's /v1/prewarm ahead of it by the lead and loses none of either; the router's picture
counts a prewarm's user side where it was sent; a cell counts the prewarms and charges their
engine time in goodput; the relay's options are checked before any model loads."""

from __future__ import annotations

import argparse
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rcllm.errors import RcllmError
from rcllm.loadgen import series as sw
from rcllm.loadgen.cells import cell_metrics
from rcllm.loadgen.client import run_load, schedule
from rcllm.serve.server import start_in_thread

LEAD_S = 0.3


def _recorder(seen: list, refuse_user: str) -> FastAPI:
    """Answers /v1/prewarm (503 for `refuse_user`) and /v1/rank, noting when each arrived."""
    app = FastAPI()

    @app.post("/v1/prewarm")
    async def prewarm(req: Request):
        body = await req.json()
        seen.append(("prewarm", body["user_id"], time.perf_counter()))
        if body["user_id"] == refuse_user:
            return JSONResponse({"error": {"field": "request", "message": "busy"}}, 503)
        assert set(body) == {"user_id", "history"}
        return {"tokens": 9, "computed": True, "instance": 1, "engine_ms": 5.0}

    @app.post("/v1/rank")
    async def rank(req: Request):
        body = await req.json()
        seen.append(("rank", body["user_id"], time.perf_counter()))
        return {"ranking": body["candidates"], "scores": {}, "method": "exact-user",
                "ttft_ms": 10.0, "total_ms": 12.0, "instance": 1,
                "stats": {"recomputed_fraction": 1.0, "chunk_hits": 0, "chunk_misses": 0,
                          "user_prefix": "hit"}}
    return app


def test_each_prewarm_leads_its_ranking_and_none_is_lost():
    seen: list = []
    running = start_in_thread(_recorder(seen, refuse_user="u2"))
    try:
        bodies = [{"user_id": f"u{k}", "history": [], "candidates": ["a"]} for k in range(4)]
        res = run_load(running.url, bodies, 0, 30.0, arrivals_s=[0.0, 0.1, 0.1, 0.5],
                       keep_rows=True, relay_lead_s=LEAD_S)
    finally:
        running.stop()
    at = {(kind, user): t for kind, user, t in seen}
    assert len(seen) == 8 and res["sent"] == 4 and res["ok"] == 4     # every ranking sent
    for k in range(4):
        lead = at[("rank", f"u{k}")] - at[("prewarm", f"u{k}")]
        assert lead == pytest.approx(LEAD_S, abs=0.1), (k, lead)
    pre = res["prewarms"]
    assert [p["status"] for p in pre] == [200, 200, 503, 200]
    rows = res["requests"]
    assert [r["prewarm_status"] for r in rows] == [200, 200, 503, 200]
    assert [r["prewarm_instance"] for r in rows] == [1, 1, None, 1]
    assert [r["prewarm_ready"] for r in rows] == [True, True, False, True]
    # the wall time runs from the first ranking's send, not from the first prewarm's
    assert res["wall_s"] < 0.5 + LEAD_S
    m = cell_metrics(rows, res["wall_s"], 60_000, prewarms=pre)
    assert (m["prewarms"], m["prewarm_ok"], m["prewarm_errors"]) == (4, 3, 1)
    assert m["prewarm_ready"] == 0.75 and m["prewarm_followed"] == 1.0


def test_the_schedule_puts_each_prewarm_the_lead_before_its_ranking():
    assert schedule([0.0, 1.0], 0.5) == [(-0.5, 0, 0), (0.0, 1, 0), (0.5, 0, 1), (1.0, 1, 1)]
    assert schedule([0.0, 0.0], None) == [(0.0, 1, 0), (0.0, 1, 1)]


def test_goodput_per_engine_second_charges_the_prewarms():
    rows = [{"status": 200, "latency_ms": ms, "ttft_ms": 90.0, "total_ms": 100.0, "hits": 0,
             "lookups": 0, "instance": 0, "user_prefix": "hit", "prewarm_instance": 0,
             "prewarm_ready": True, "prewarm_status": 200} for ms in (200, 300, 9000)]
    pre = [{"status": 200, "engine_ms": 50.0, "computed": True, "instance": 0}] * 3
    alone = cell_metrics(rows, 2.0, 1000)
    relayed = cell_metrics(rows, 2.0, 1000, prewarms=pre)
    # 2 rankings within the SLO; 300 ms of ranking engine time, + 150 ms of prewarms
    assert alone["goodput_rps"] == relayed["goodput_rps"] == 1.0
    assert alone["goodput_per_engine_s"] == pytest.approx(2 / 0.3)
    assert relayed["goodput_per_engine_s"] == pytest.approx(2 / 0.45)
    assert (relayed["prewarm_engine_ms"], relayed["prewarm_computed"]) == (150.0, 3)
    assert alone["prewarms"] == 0 and alone["prewarm_ready"] is None


def test_the_relay_goes_in_front_of_the_series_that_read_the_user_side():
    out = sw.with_relay(sw.series_of("full,prefix,exact-user", "load-only", False), 2.0)
    lead = {(s.name, s.policy): s.relay_lead_s for s in out}
    assert lead == {("full", "load-only"): None, ("prefix", "prefix-aware"): None,
                    ("exact-user", "user-side"): 2.0, ("rcllm-0.3/0.3", "load-only"): 2.0}
    only = sw.with_relay(out, 1.0, "exact-user")
    assert [s.relay_lead_s for s in only if s.method == "rcllm"] == [None]
    assert sw.with_relay(out, None) == out


@pytest.mark.parametrize("lead, methods, match", [
    (-1.0, None, ">= 0"), (float("nan"), None, ">= 0"), (2.0, "prefix", "read"),
    (2.0, "late", "no series"), (None, "exact-user", "needs --relay-lead-s")])
def test_a_bad_relay_is_refused(lead, methods, match):
    with pytest.raises(RcllmError, match=match):
        sw.with_relay(sw.series_of("full,prefix,exact-user", "", False), lead, methods)


@pytest.mark.parametrize("options, match", [
    (["--relay-lead-s", "-2", "--scorer", "pointwise"], ">= 0"),
    (["--methods", "full,exact-user"], "pointwise"),
    (["--methods", "rcllm:0.3:0.3", "--relay-lead-s", "1", "--scorer", "verbalizer"],
     "pointwise")])
def test_bad_relay_options_fail_before_any_model_loads(monkeypatch, tmp_path, options, match):
    import rcllm.launch as launch
    from rcllm.commands.bench_serve import register_bench
    from rcllm.loadgen.sweep import run_sweep

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before the options were checked")

    monkeypatch.setattr(launch, "load_data", no_load)
    top = argparse.ArgumentParser()
    register_bench(top.add_subparsers())
    args = top.parse_args(["serve", "--sweep", "--policies", "", "--out", str(tmp_path),
                           *options])
    with pytest.raises(RcllmError, match=match):
        run_sweep(args)


def test_a_ranking_follows_its_prewarm_from_the_moment_it_is_sent():
    """The router's picture counts the user side on the prewarm's instance as soon as the
    prewarm leaves (a relay's ranking that arrives while it still queues follows it there);
    a failed prewarm is forgotten, and user-side routing then goes by load."""
    from rcllm.routing import CostModel, MethodConfig, cpu_smollm2_profile, routing_policy
    from rcllm.serve.picture import Picture
    from rcllm.serve.views import UserResidency, live_instances, routing_request

    profile = cpu_smollm2_profile()
    insts = live_instances([["a"], ["a"], ["a"]])
    picture = Picture(insts, profile, UserResidency(60.0, history_window=10), None)
    history = [{"item_id": "h1", "rating": 4.0, "review": "", "timestamp": 1}]
    body = {"user_id": "u", "history": history, "candidates": ["a"]}
    request = routing_request(body, {"a": 30}, True, 10)
    policy = routing_policy("user-side", CostModel(profile, MethodConfig()))
    for inst in insts:              # the prewarm's instance is the busiest but one
        inst.started(100.0 * (inst.index != 2))
    picture.prewarm_sent(insts[1], {"user_id": "u", "history": history})
    assert policy.choose(request, picture.view(insts, body)) == 1
    picture.prewarm_failed(insts[1], {"user_id": "u", "history": history})
    assert picture.residency.home("u", history) is None
    assert policy.choose(request, picture.view(insts, body)) == 2      # by load
