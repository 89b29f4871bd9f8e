"""What each cell of the served sweep records of where its KV came from (issue 51): chunk hits,
item tokens computed on the spot, KV imported between instances and the TTFT the misses cost;
and the sweep's options for the trace window, placement and affinity's weight. No Ray."""

from __future__ import annotations

import argparse

import pytest

from rcllm.loadgen.cells import TABLE, cell_metrics
from rcllm.loadgen.client import _item_tokens
from rcllm.loadgen.sweep import _idle_weight, price_misses
from rcllm.routing import CostModel, MethodConfig, cpu_smollm2_profile


def test_a_request_s_item_tokens_and_those_the_store_did_not_serve():
    st = {"tokens_by_kind": {"item": 300, "history": 500}, "reused_tokens": {"item": 200},
          "chunk_hits": 6, "chunk_misses": 2}
    assert _item_tokens(st) == {"item_tokens": 300, "item_miss_tokens": 100,
                                "history_tokens": 500}
    # full and prefix look nothing up: nothing missed
    assert _item_tokens({**st, "chunk_hits": 0, "chunk_misses": 0})["item_miss_tokens"] == 0


def _row(hits, lookups, items, missed, fetched=0, ttft=400.0):
    return {"status": 200, "latency_ms": ttft + 50, "ttft_ms": ttft, "total_ms": ttft + 10,
            "instance": 0, "hits": hits, "lookups": lookups, "fetched": fetched,
            "context_tokens": items + 600, "item_tokens": items, "item_miss_tokens": missed,
            "import_ms": 5.0 * fetched, "import_wait_ms": 1.0 * fetched,
            "imports_late": int(fetched > 0)}


def test_a_cell_records_hits_misses_imports_and_what_the_misses_cost():
    cost = CostModel(cpu_smollm2_profile(), MethodConfig())
    rows = [_row(8, 10, 400, 0), _row(5, 10, 400, 160, fetched=3), _row(0, 0, 400, 0),
            {"status": 429}]
    price_misses(rows, cost)
    assert rows[0]["miss_cost_ms"] == 0.0 and rows[1]["miss_cost_ms"] > 0
    assert rows[2]["miss_cost_ms"] is None                   # a method that looks nothing up
    assert "miss_cost_ms" not in rows[3]
    m = cell_metrics(rows, wall_s=2.0, slo_ms=5000)
    assert (m["chunk_hits"], m["chunk_misses"]) == (13, 7)
    assert m["item_miss_tokens"] == 160 and m["item_tokens"] == 1200
    assert (m["kv_imported_items"], m["kv_import_ms"], m["kv_import_wait_ms"]) == (3, 15.0, 3.0)
    assert m["kv_imports_late"] == 1
    assert m["miss_cost_mean_ms"] == pytest.approx(rows[1]["miss_cost_ms"] / 2)
    assert m["miss_cost_share"] == pytest.approx(rows[1]["miss_cost_ms"] / 1200)
    assert {"item_miss_tokens", "kv_imported_items", "miss_cost_p50_ms", "held_items"} <= set(TABLE)
    # a sweep recorded before these fields re-reads without them
    old = cell_metrics([{k: v for k, v in _row(8, 10, 400, 0).items()
                         if k not in ("item_tokens", "item_miss_tokens")}], 1.0, 5000)
    assert old["miss_cost_p50_ms"] is None and old["item_miss_tokens"] == 0


def test_the_sweep_options_for_window_placement_and_weight():
    from rcllm.commands.bench_serve import register_bench

    top = argparse.ArgumentParser()
    register_bench(top.add_subparsers())
    args = top.parse_args(["serve", "--sweep"])
    assert (args.trace_window, args.placement, args.policies) == (
        "users", "metis", "affinity,cost,hit-only,load-only,round-robin")
    assert _idle_weight(args) is None                        # derived from the cost model
    args = top.parse_args(["serve", "--sweep", "--placement", "random",
                           "--affinity-idle-weight", "4", "--trace-window", "at:0.5"])
    assert (args.placement, _idle_weight(args), args.trace_window) == ("random", 4.0, "at:0.5")
    for bad in (["--placement", "hash"], ["--affinity-idle-weight", "-1"],
                ["--affinity-idle-weight", "heavy"]):
        with pytest.raises(SystemExit):
            top.parse_args(["serve", "--sweep", *bad])


def test_serve_passes_placement_and_weight_to_the_router(monkeypatch):
    """`rcllm serve --instances 2 --placement random ...` reaches RayBackend's arguments."""
    import rcllm.serve.router as router
    from rcllm.commands.serve import make_backend, register

    seen = {}

    def fake(spec, k, queue_size, policy, address, **kw):
        seen.update(k=k, policy=policy, **kw)
        return "backend"

    monkeypatch.setattr(router, "RayBackend", fake)
    top = argparse.ArgumentParser()
    register(top.add_subparsers(), None)
    args = top.parse_args(["serve", "--instances", "2", "--policy", "cost", "--placement",
                           "random", "--placement-seed", "3", "--profile", "builtin"])
    assert make_backend(args) == "backend"
    assert (seen["k"], seen["policy"], seen["placement"], seen["placement_seed"],
            seen["w_idle"]) == (2, "cost", "random", 3, None)
    args = top.parse_args(["serve", "--instances", "2", "--affinity-idle-weight", "4"])
    make_backend(args)
    assert (seen["placement"], seen["w_idle"]) == ("metis", 4.0)


def test_the_sweep_reads_a_profile_saved_by_a_separate_calibration_run(tmp_path):
    from rcllm.errors import RcllmError
    from rcllm.loadgen.sweep import _router_profile
    from rcllm.routing.profiles import save_profile

    saved = cpu_smollm2_profile().replace(name="served@calibrated")
    save_profile(saved, tmp_path / "profile.json")
    assert _router_profile(argparse.Namespace(profile=str(tmp_path / "profile.json"))) == saved
    assert _router_profile(argparse.Namespace(profile="calibrate")) == "calibrate"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(RcllmError, match="not a saved speed profile"):
        _router_profile(argparse.Namespace(profile=str(tmp_path / "bad.json")))


def test_a_routing_only_sweep_judges_the_policies_and_no_baseline_ratio():
    """A sweep of rcllm 0.3/0.3 under the five policies (no prefix series): the verdict says
    which policy had the lowest P99 and claims no goodput ratio against an absent baseline."""
    from rcllm.loadgen.targets import format_targets, sweep_targets

    p99 = {"affinity": 900, "cost": 800, "hit-only": 1000, "load-only": 850, "round-robin": 990}
    cells = [{"method": "rcllm-0.3/0.3", "policy": p, "rate_rps": r, "ttft_p99_ms": ms,
              "ttft_p50_ms": 100, "ok": 10, "sent": 10, "rejected_429": 0, "lost": 0,
              "errors_5xx": 0, "goodput_rps": 1.0, "series": f"rcllm-0.3/0.3 @ {p}"}
             for r in (1.0, 2.0) for p, ms in p99.items()]
    t = sweep_targets(cells, 5000)
    assert t["goodput_vs_baseline"] == {"rcllm-0.3/0.3": None}
    assert [(p["affinity_lowest"], p["cost_lowest"]) for p in t["policies_at_top_rates"]] == [
        (False, True)] * 2
    assert "cost below hit-only and load-only: yes" in format_targets(t)
