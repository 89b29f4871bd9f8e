"""`rcllm bench serve --sweep` (issue 30 item 1): the rate sweep over methods and routing
policies on 2 tiny Ray instances with a private Redis, end to end; and its parts (trace,
rates, series, cell numbers) without Ray."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from rcllm.errors import RcllmError
from rcllm.loadgen import series as sweep
from rcllm.loadgen.cells import cell_metrics
from rcllm.loadgen.trace import review_trace


@pytest.fixture(scope="module")
def trace(synthetic):
    return review_trace(synthetic, 30, 8, seed=0)


def test_trace_keeps_repeats_and_compresses_to_the_rate(trace, synthetic):
    assert len(trace.bodies) == 30 and trace.repeats() > 0
    assert all(len(b["candidates"]) == 8 and len(set(b["candidates"])) == 8
               for b in trace.bodies)
    assert np.all(np.diff(trace.times_s) >= 0)
    for rate in (0.5, 4.0):
        a = trace.arrivals_s(rate)
        assert a[0] == 0 and np.all(np.diff(a) >= 0)
        assert (len(a) - 1) / a[-1] == pytest.approx(rate)
        # the trace's relative gaps are kept at every rate
        np.testing.assert_allclose(a * rate, trace.arrivals_s(1.0), rtol=1e-9, atol=1e-9)
    # a repeated user's later request carries the longer history, never a future review
    seen: dict[str, int] = {}
    for b, t in zip(trace.bodies, trace.times_s):
        assert all(h["timestamp"] <= t for h in b["history"])
        n = len(b["history"])
        assert n >= seen.get(b["user_id"], 0) or n == 10
        seen[b["user_id"]] = n


def test_rates_series_and_cell_numbers():
    assert sweep.parse_rates("0.5,2x") == [(0.5, False), (2.0, True)]
    for bad in ("", "0", "-1x", "fast"):
        with pytest.raises(RcllmError):
            sweep.parse_rates(bad)
    series = sweep.series_of(sweep.DEFAULT_METHODS, sweep.DEFAULT_POLICIES, adapter=True)
    names = [(s.name, s.policy) for s in series]
    assert names == [("full", "load-only"), ("prefix", "prefix-aware"),
                     ("prefix@load-only", "load-only"), ("rcllm-0.3/0.3", "affinity"), ("rcllm-0.15/0.15", "affinity"),
                     ("adapter", "affinity"), ("rcllm-0.3/0.3", "cost"),
                     ("rcllm-0.3/0.3", "hit-only"),
                     ("rcllm-0.3/0.3", "load-only"), ("rcllm-0.3/0.3", "round-robin")]
    assert series[3].body({"user_id": "u"}) == {"user_id": "u", "method": "rcllm",
                                                 "item_ratio": 0.3, "history_ratio": 0.3}
    assert "method" not in series[5].fields          # the adapter's own default method
    with pytest.raises(RcllmError):
        sweep.series_of("full", "nearest", adapter=False)
    rows = [{"status": 200, "latency_ms": ms, "ttft_ms": ms / 2, "total_ms": ms / 2 + 1,
             "hits": 3, "lookups": 4, "instance": i % 2, "user_prefix": up}
            for i, (ms, up) in enumerate([(100, "hit"), (300, "miss"), (900, "hit")])]
    rows += [{"status": 429}, {"status": 503}, {"status": -1, "error": "ReadTimeout"}]
    m = cell_metrics(rows, wall_s=2.0, slo_ms=500)
    assert (m["sent"], m["ok"], m["rejected_429"], m["errors_5xx"], m["lost"]) == (6, 3, 1, 1, 1)
    assert m["goodput_rps"] == 1.0 and m["slo_attainment"] == pytest.approx(2 / 6)
    assert m["ttft_p50_ms"] == 300 and m["chunk_hit_ratio"] == 0.75
    assert m["user_prefix_hit_ratio"] == pytest.approx(2 / 3)
    assert m["user_prefix_append_ratio"] == 0
    assert m["queue_p50_ms"] == pytest.approx(149) and m["per_instance"] == {"0": 2, "1": 1}
    lo, hi = m["ttft_p99_ci90"]
    assert lo <= m["ttft_p99_ms"] <= hi


def test_bench_serve_sweep_end_to_end(tiny_model_dir, tmp_path):
    """Tiny: 6 requests per cell, one absolute and one capacity-relative rate, 4 series.
    Asserts behaviour only (the machine may be busy): every request accounted for, no 5xx,
    none lost, the outputs written, full reuses no chunk and rcllm does, prefix is routed
    prefix-aware and its hit ratio counted beyond the instruction."""
    from rcllm.commands.bench_serve import register_bench

    top = argparse.ArgumentParser()
    register_bench(top.add_subparsers())
    out = tmp_path / "sweep"
    args = top.parse_args([
        "serve", "--sweep", "--requests", "6", "--candidates", "6", "--rates", "6,0.5x",
        "--methods", "full,prefix,rcllm:0.3:0.3", "--policies", "affinity,round-robin",
        "--queue-size", "8", "--slo-ms", "60000", "--out", str(out),
        "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=1"])
    assert args.func(args) == 0
    report = json.loads((out / "sweep.json").read_text())
    assert report["capacity_rps"] > 0 and report["trace"]["requests"] == 6
    assert report["behind_nice"] == 10           # the default the simulator weighs builders by
    cells = report["cells"]
    assert [(c["method"], c["policy"]) for c in cells[:4]] == [
        ("full", "load-only"), ("prefix", "prefix-aware"), ("rcllm-0.3/0.3", "affinity"),
        ("rcllm-0.3/0.3", "round-robin")]
    assert len(cells) == 8
    assert cells[0]["rate_rps"] == 6 and cells[4]["rate_rps"] == pytest.approx(
        0.5 * report["capacity_rps"])
    for c in cells:
        assert c["sent"] == 6 and c["ok"] + c["rejected_429"] == 6, c
        assert c["errors_5xx"] == 0 and c["lost"] == 0 and c["other_4xx"] == 0
        assert sum(c["per_instance"].values()) == c["ok"]
        assert c["ttft_p50_ms"] <= c["ttft_p90_ms"] <= c["ttft_p99_ms"]
        assert c["goodput_rps"] > 0 and c["slo_attainment"] == c["ok"] / 6
        assert len(c["loadavg_1m"]) == 2
        # the machine's speed before the cell: one reference pass per instance
        assert len(c["reference_ms"]) == 2 and min(c["reference_ms"]) > 0
        assert 0 < c["engine_cpu_p50_ms"] <= c["engine_ttft_p99_ms"]
    assert all(c["chunk_hit_ratio"] == 0 for c in cells if c["method"] in ("full", "prefix"))
    assert all(c["chunk_hit_ratio"] > 0 for c in cells if c["method"].startswith("rcllm"))
    # the prefix cache's hits beyond the instruction (which every instance holds from start):
    # full looks nothing up; every cell says its ratio
    assert report["prefix_instruction_tokens"] > 0
    assert all(0 <= c["prefix_hit_ratio"] <= 1 for c in cells)
    assert all(c["prefix_hit_ratio"] == 0 for c in cells if c["method"] == "full")
    assert report["trace"]["history_extends"] <= report["trace"]["repeat_requests"]
    # where the KV came from (issue 51): hits, misses computed on the spot and what they cost
    for c in cells:
        assert c["chunk_hits"] + c["chunk_misses"] == sum(r["lookups"] for r in c["requests"]
                                                          if r["status"] == 200)
        assert c["kv_imported_items"] == 0           # beside the Redis tier nothing is imported
        assert len(c["held_items"]) == 2
        if c["method"] in ("full", "prefix"):
            assert c["miss_cost_p50_ms"] is None and c["item_miss_tokens"] == 0
        else:
            assert c["miss_cost_p50_ms"] >= 0 and 0 <= c["item_miss_tokens"] <= c["item_tokens"]
    placed = report["placement"]
    assert placed["method"] == "metis" and placed["catalog_item_kv_bytes"] > 0
    assert report["trace"]["window"] == "users" and report["affinity_idle_weight"] is None
    assert {c["requests"][0]["status"] for c in cells} <= {200, 429}
    # each answer's behind work (for the simulator): [computed, context] per queued job
    assert all(all(0 < n <= ctx for n, ctx in r["behind_tokens"])
               for c in cells for r in c["requests"] if r["status"] == 200)
    # where each answer's time went, and the CPU its engine thread used (one thread each)
    for r in (r for c in cells for r in c["requests"] if r["status"] == 200):
        parts = r["build_ms"] + r["assemble_ms"] + r["prefill_ms"]
        # CPU and wall are two clocks: CPU within the TTFT's window, to their resolution
        assert parts == pytest.approx(r["ttft_ms"])
        assert 0 < r["thread_cpu_ms"] <= r["ttft_ms"] + 0.1
        # and the time it waited for a core (Linux reports it): within what the CPU left
        assert 0 <= r["run_wait_ms"] <= r["ttft_ms"] - r["thread_cpu_ms"] + 1.0
    for c in cells:
        split = c["engine_time_split"]
        assert split["cpu"] > 0 and split["run_wait"] >= 0
        assert split["cpu"] + split["run_wait"] + split["blocked"] == pytest.approx(1.0)
    table = (out / "sweep.md").read_text()
    assert table.count("\n| ") >= 7 and "rcllm-0.3/0.3 @ round-robin" in table
    assert len(json.loads((out / "sweep.partial.json").read_text())["cells"]) == 8
    for png in ("ttft_vs_rate_methods.png", "ttft_vs_rate_policies.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert report["targets"]["slo_ms"] == 60000 and "targets at SLO 60000 ms" in table
    # the same sweep re-read at a 1 ms SLO: no request within it, nothing measured again
    again = top.parse_args(["serve", "--report", str(out / "sweep.json"), "--slo-ms", "1",
                            "--out", str(tmp_path / "reread")])
    assert again.func(again) == 0
    reread = json.loads((tmp_path / "reread" / "sweep.json").read_text())
    assert [c["ttft_p50_ms"] for c in reread["cells"]] == [c["ttft_p50_ms"] for c in cells]
    assert all(c["goodput_rps"] == 0 for c in reread["cells"])


def test_the_policy_series_is_named_as_old_cells_are_read():
    from rcllm.routing.registry import LEGACY_POLICY_SERIES

    assert sweep.parse_method(sweep.POLICY_METHOD)[0] == LEGACY_POLICY_SERIES


def test_a_sweep_without_the_redis_tier_keeps_each_instance_s_own_items(
        tiny_model_dir, tmp_path, monkeypatch, synthetic):
    """--no-redis: no Redis server is started, and with an item budget of a third of the
    catalog's KV each instance holds (and the router counts) only part of the catalog."""
    import dataclasses

    from rcllm.commands.bench_serve import register_bench
    from rcllm.config import ModelConfig, RcllmConfig
    from rcllm.kvstore.redis_server import RedisServer
    from rcllm.launch import make_stored_engine

    def no_redis(self):
        raise AssertionError("--no-redis started a Redis server")

    monkeypatch.setattr(RedisServer, "start", no_redis)
    probe = make_stored_engine(dataclasses.replace(
        RcllmConfig(), model=ModelConfig(path=str(tiny_model_dir), threads=0)),
        dict(synthetic.items))
    probe.build_items(list(synthetic.items))
    budget = probe.store.nbytes // 3
    top = argparse.ArgumentParser()
    register_bench(top.add_subparsers())
    out = tmp_path / "sweep"
    args = top.parse_args([
        "serve", "--sweep", "--no-redis", "--cell-reset", "--requests", "6",
        "--candidates", "6", "--rates", "6,5", "--methods", "rcllm:0.3:0.3",
        "--policies", "affinity",
        "--placement", "random", "--no-imports",
        "--queue-size", "8", "--slo-ms", "60000", "--out", str(out),
        "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=1",
        "--set", f"reuse.store_bytes={budget}"])
    assert args.func(args) == 0
    report = json.loads((out / "sweep.json").read_text())
    assert report["redis_tier"] is False
    assert "no Redis tier" in (out / "sweep.md").read_text()
    cell, second = report["cells"]
    assert cell["ok"] + cell["rejected_429"] == 6 and cell["errors_5xx"] == cell["lost"] == 0
    # --cell-reset: both cells start from the stores the warm-up left
    assert report["cell_reset"] is True
    assert second["held_at_start"] == cell["held_at_start"]
    assert second["held_items"] != [0, 0]
    held = cell["held_items"]
    assert len(held) == 2 and all(0 < n < len(synthetic.items) for n in held), held
    # random shards of METIS's sizes, each instance warmed with its own (what its store kept)
    placed = report["placement"]
    assert placed["method"] == "random" and len(placed["shard_items"]) == 2
    assert all(0 < kept <= n for kept, n in zip(placed["held_after_build"],
                                                placed["placed_items"]))
    # what the simulator's cache replay reads: the placement in build order, the item token
    # counts, the warm-up's requests and each request's candidates and history
    assert [len(p) for p in placed["placed"]] == placed["placed_items"]
    assert set(report["item_tokens"]) == set(synthetic.items)
    assert report["warm_requests"] and report["history_bytes"] > 0
    row = next(r for r in cell["requests"] if r["status"] == 200)
    assert row["items"] and row["user"] and "history_items" in row
    # --no-imports: no item KV moved between the instances
    assert cell["kv_imported_items"] == 0 and report["config"]["no_imports"] is True
    from rcllm.routing import cpu_smollm2_profile
    from rcllm.sim.served import predict_sweep

    rows, _ = predict_sweep(report, cpu_smollm2_profile(), routing="caches")
    assert 0 <= rows[0]["predicted_chunk_hit_ratio"] <= 1
    # --cell-reset needs each instance's own memory only: refused beside Redis, before a model
    bad = top.parse_args(["serve", "--sweep", "--cell-reset", "--out", str(tmp_path / "no")])
    with pytest.raises(RcllmError, match="--cell-reset"):
        bad.func(bad)
    assert not (tmp_path / "no").exists()
