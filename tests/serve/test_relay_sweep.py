"""The relay in the served sweep end to end (issue 60 item 3): 2 tiny pointwise Ray instances,
`--methods prefix,exact-user --relay-lead-s`: exact-user's rankings follow their prewarms to
the instance that computed the user side and hit it there; prefix runs without the relay; the
cells count the prewarms and charge their engine time in goodput."""

from __future__ import annotations

import argparse
import json

import pytest


def test_exact_user_behind_a_relay_hits_where_it_was_prewarmed(tiny_model_dir, tmp_path):
    from rcllm.commands.bench_serve import register_bench

    top = argparse.ArgumentParser()
    register_bench(top.add_subparsers())
    out = tmp_path / "sweep"
    args = top.parse_args([
        "serve", "--sweep", "--scorer", "pointwise", "--requests", "6", "--candidates", "6",
        "--rates", "1", "--methods", "prefix,exact-user", "--policies", "",
        "--relay-lead-s", "1.0", "--queue-size", "8", "--slo-ms", "60000", "--out", str(out),
        "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=1"])
    assert args.func(args) == 0
    report = json.loads((out / "sweep.json").read_text())
    prefix, exact = report["cells"]
    assert (prefix["policy"], exact["policy"]) == ("prefix-aware", "user-side")
    assert prefix["relay_lead_s"] is None and prefix["prewarms"] == 0
    assert prefix["prewarm_engine_ms"] == 0 and prefix["goodput_per_engine_s"] > 0
    assert exact["relay_lead_s"] == 1.0
    for c in (prefix, exact):
        assert c["sent"] == 6 and c["ok"] == 6 and c["errors_5xx"] == c["lost"] == 0, c
    assert (exact["prewarms"], exact["prewarm_ok"], exact["prewarm_errors"]) == (6, 6, 0)
    assert exact["prewarm_computed"] >= 1 and exact["prewarm_engine_ms"] > 0
    # every ranking went where its prewarm put the user side, and hit it there
    assert exact["prewarm_followed"] == 1.0
    for r in exact["requests"]:
        assert r["instance"] == r["prewarm_instance"] and r["method"] == "exact-user"
        if r["prewarm_ready"]:
            assert r["user_prefix"] == "hit", r
    assert exact["prewarm_ready"] >= 0.5
    # goodput per engine second charges the prewarms' engine time
    within = sum(r["latency_ms"] <= 60000 for r in exact["requests"])
    assert exact["goodput_per_engine_s"] == pytest.approx(
        within / ((exact["rank_engine_ms"] + exact["prewarm_engine_ms"]) / 1e3))
    # each prewarm left the lead before its ranking (the client's clock)
    for r, p in zip(exact["requests"], exact["prewarm_requests"]):
        assert r["sent_s"] - p["sent_s"] == pytest.approx(1.0, abs=0.25)
    assert "prewarms" in (out / "sweep.md").read_text()
