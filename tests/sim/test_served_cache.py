"""`rcllm sim sweep --routing caches` (issue 51 item 4): the served sweep predicted with
simulated stores and the router's own policies — the store's eviction, the placement and
warm-up replay, hits, imports and the hit ratios per policy."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.errors import RcllmError
from rcllm.routing import cpu_smollm2_profile
from rcllm.sim import served, served_cache
from rcllm.sim.served_stores import ClusterCaches, StoreSim

KV = cpu_smollm2_profile().model.kv_bytes_per_token


def test_the_store_evicts_the_least_recent_entries_by_bytes():
    s = StoreSim(budget=300)
    for name in ("a", "b", "c"):
        s.put(("item", name), 100)
    s.touch(("item", "a"))                      # b is now the least recent
    s.put(("hist", "d1", "u", "x"), 100)
    assert ("item", "b") not in s and s.items == {"a", "c"} and s.nbytes == 300
    s.put(("item", "big"), 301)                 # larger than the whole store: not kept
    assert ("item", "big") not in s and s.nbytes == 300


def _sweep(placed, tokens, cells, budget_items=10, warm=(), redis=False):
    return {"name": "bench.serve.sweep", "redis_tier": redis, "instances": len(placed),
            "config": {"overrides": [f"reuse.store_bytes={budget_items * 10 * KV}"],
                       "profile": "calibrate"},
            "placement": {"placed": placed}, "item_tokens": tokens, "capacity_rps": 100.0,
            "warm_requests": list(warm), "trace": {"requests": len(warm)},
            "affinity_idle_weight": None,
            "series": [{"name": "rcllm-0.3/0.3", "policy": c["policy"],
                        "fields": {"method": "rcllm", "item_ratio": 0.3, "history_ratio": 0.3}}
                       for c in cells], "cells": cells}


def _row(items, user="u1", hist=(), instance=0):
    n = 10 * len(items)
    return {"status": 200, "method": "rcllm", "user": user, "items": list(items),
            "history_items": list(hist), "history_tokens": 20 * len(hist),
            "item_tokens": n, "context_tokens": 100 + n + 20 * len(hist),
            "recomputed_tokens": 100, "instance": instance, "ttft_ms": 100.0,
            "hits": 0, "lookups": len(items) + len(hist), "item_miss_tokens": 0}


def _cell(policy, rows, gap_s=10.0):
    return {"policy": policy, "method": "rcllm-0.3/0.3", "series": f"rcllm-0.3/0.3 @ {policy}",
            "rate_rps": 1 / gap_s, "arrivals_s": [gap_s * i for i in range(len(rows))],
            "requests": rows, "chunk_hit_ratio": 0.5, "ttft_p50_ms": 100.0,
            "ttft_p99_ms": 100.0, "engine_ttft_p50_ms": 90.0}


def test_the_placement_keeps_the_last_built_items_that_fit_and_the_warm_up_fills_the_stores():
    tokens = {f"i{k}": 10 for k in range(8)}
    sweep = _sweep([["i0", "i1", "i2", "i3"], ["i4", "i5"]], tokens, [], budget_items=3,
                   warm=[_row(["i6"], instance=1), {**_row(["i7"]), "lookups": 0}])
    caches = ClusterCaches(sweep, KV)
    caches.warm(sweep["warm_requests"], 2)
    assert caches.stores[0].items == {"i1", "i2", "i3"}     # i0 built first, evicted
    # the warm-up's request went to instance 1 and left its item there; the prefix probe
    # (no look-up) left nothing
    assert caches.stores[1].items == {"i4", "i5", "i6"}
    with pytest.raises(RcllmError, match="shared tier"):
        ClusterCaches({**sweep, "redis_tier": True}, KV)
    with pytest.raises(RcllmError, match="placement"):
        ClusterCaches({**sweep, "placement": {}}, KV)


def _predict(sweep):
    profile = served.fit_profile(_fit_records())
    return served.predict_sweep(sweep, profile, routing="caches")


def _fit_records():
    rng = np.random.default_rng(0)
    out = []
    for method in ("full", "rcllm"):
        for _ in range(8):
            ctx = int(rng.integers(300, 900))
            comp = ctx if method == "full" else int(ctx * 0.3)
            out.append({"method": method, "context_tokens": ctx, "recomputed_tokens": comp,
                        "ttft_ms": 20 + comp + 0.1 * (ctx - comp) * (method == "rcllm")})
    return out


def test_hit_only_goes_where_the_items_are_and_a_miss_is_a_hit_next_time():
    tokens = {f"a{k}": 10 for k in range(4)} | {f"b{k}": 10 for k in range(4)} | {"new": 10}
    placed = [["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]]
    rows = [_row(["b0", "b1"]), _row(["new", "b2"]), _row(["new", "b3"], hist=["h1"])]
    rows_hist = [_row(["a0"], user="u9", hist=["h1", "h2"]) for _ in range(2)]
    sweep = _sweep(placed, tokens, [_cell("hit-only", rows), _cell("hit-only", rows_hist)])
    out, summary = _predict(sweep)
    first, second = out
    assert first["routing"] == "caches" and summary["router_profile"] == "fit"
    # request 1: both items on instance 1; 2: b2 there, "new" built there; 3: both held,
    # its history chunk missed (6 item chunks + 1 history chunk, 5 hits)
    assert first["predicted_chunk_hit_ratio"] == pytest.approx(5 / 7)
    assert first["predicted_item_token_hit_ratio"] == pytest.approx(5 / 6)
    # the next cell redates the histories: the same user's chunks miss once, then hit
    assert second["predicted_chunk_hit_ratio"] == pytest.approx(4 / 6)


def test_an_item_held_elsewhere_is_imported_when_it_arrives_within_what_it_saves():
    tokens = {"a": 10, "b": 10}
    placed = [["a"], ["b"]]
    # round-robin sends the second request to instance 1 while instance 0 serves the first
    # (100 ms): "a" is exported by instance 0 once that request ends
    for gap_s, imported in ((0.0995, True), (0.001, False)):
        rows = [_row(["a"]), _row(["a"])]
        sweep = _sweep(placed, tokens, [_cell("round-robin", rows, gap_s=gap_s)])
        replay = served_cache.CacheReplay(sweep, served.fit_profile(_fit_records()),
                                          lambda m, n, ctx: 100.0, lambda n: 0.0)
        ttft, _svc, hits = replay.cell(sweep["cells"][0])
        sent = 1e3 * gap_s
        if imported:        # the owner is free 0.5 ms later: waited for, then a hit
            assert hits["chunk_hit_ratio"] == 1.0 and hits["kv_imported_items"] == 1
            assert ttft[1] == pytest.approx(100.0 - sent + 100.0, abs=0.1)  # + the transfer
            assert "a" in replay.caches.stores[1].items
        else:               # 99 ms late: waited for what it saves, then recomputed
            assert hits["chunk_hit_ratio"] == 0.5 and hits["kv_imported_items"] == 0
            budget = ttft[1] - 100.0
            assert 0.0 < budget < 100.0 - sent



def test_measured_service_cannot_go_with_simulated_caches():
    sweep = _sweep([["a"], ["b"]], {"a": 10, "b": 10}, [_cell("affinity", [_row(["a"])])])
    with pytest.raises(RcllmError, match="caches"):
        served.predict_sweep(sweep, served.fit_profile(_fit_records()), routing="caches",
                             service="measured")


def test_a_cell_routed_by_a_picture_the_replay_lacks_is_refused_before_simulating():
    """A policy the replay keeps no picture for (here one no registry knows) refuses the whole
    sweep, naming the policy and the routings that can predict it; prefix-aware is simulated
    (tests/sim/test_replay_prefix.py)."""
    cells = [_cell("affinity", [_row(["a"])]), _cell("made-up", [_row(["b"])])]
    sweep = _sweep([["a"], ["b"]], {"a": 10, "b": 10}, cells)
    with pytest.raises(RcllmError, match="made-up.*--routing replay or policy"):
        _predict(sweep)
    # the same sweep without that cell is simulated
    rows, _ = _predict({**sweep, "cells": cells[:1]})
    assert rows[0]["routing"] == "caches"


def test_the_cli_replays_the_caches_and_asks_what_another_budget_would_find(tmp_path):
    import argparse
    import json

    from rcllm.commands.sim import register

    tokens = {f"i{k}": 10 for k in range(6)}
    # six items placed three per store, each store room for six; every request asks for all
    rows = [_row([f"i{k}" for k in range(6)]) for _ in range(4)]
    sweep = _sweep([["i0", "i1", "i2"], ["i3", "i4", "i5"]], tokens,
                   [_cell("affinity", rows)], budget_items=6)
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    (tmp_path / "fit.json").write_text(json.dumps({"requests": _fit_records()}))
    top = argparse.ArgumentParser()
    register(top.add_subparsers(), argparse.ArgumentParser().add_subparsers())
    base = ["sim", "sweep", "--sweep-json", str(tmp_path / "sweep.json"), "--fit-json",
            str(tmp_path / "fit.json"), "--routing", "caches"]

    def hit(*extra):
        args = top.parse_args(base + ["--out", str(tmp_path / "o")] + list(extra))
        assert args.func(args) == 0
        report = json.loads((tmp_path / "o" / "sim_sweep.json").read_text())
        assert "predicted_chunk_hit_ratio" in (tmp_path / "o" / "sim_sweep.md").read_text()
        return report["rows"][0]["predicted_chunk_hit_ratio"]

    # at the sweep's budget the other store's three items are imported: every chunk hits;
    # at a budget of two items each, a request finds at most two
    assert hit() == 1.0
    assert hit("--store-bytes", str(2 * 10 * KV)) < 1.0
    # without imports the chosen instance finds only its own three items at first
    assert hit("--no-imports") < 1.0
    with pytest.raises(RcllmError, match="--store-bytes"):
        args = top.parse_args(base[:-2] + ["--store-bytes", "5", "--out", str(tmp_path / "p")])
        args.func(args)
    with pytest.raises(RcllmError, match="--no-imports"):
        args = top.parse_args(base[:-2] + ["--no-imports", "--out", str(tmp_path / "p")])
        args.func(args)


def test_review_chunks_have_their_own_budget_and_never_push_items_out():
    tokens = {f"i{k}": 10 for k in range(3)}
    sweep = {**_sweep([["i0", "i1", "i2"], []], tokens, [], budget_items=3),
             "history_bytes": 2 * 20 * KV}           # room for two review chunks
    caches = ClusterCaches(sweep, KV)
    caches.warm([_row(["i0"], hist=[f"h{k}" for k in range(5)])], 1)
    assert caches.stores[0].items == {"i0", "i1", "i2"}
    assert len(caches.history[0].entries) == 2        # the last two of the five reviews


def test_a_cell_reset_sweep_starts_every_cell_from_the_warm_up_s_stores():
    """`bench serve --sweep --cell-reset`: what a cell built is gone in the next cell (a miss
    again), while a sweep without it carries it over (a hit)."""
    tokens = {"a0": 10, "b0": 10, "new": 10}
    placed = [["a0"], ["b0"]]
    cells = [_cell("hit-only", [_row(["new", "b0"])]), _cell("hit-only", [_row(["new", "b0"])])]
    for reset, second_hits in ((False, 1.0), (True, 0.5)):
        sweep = {**_sweep(placed, tokens, cells), "cell_reset": reset}
        out, _ = _predict(sweep)
        assert out[0]["predicted_chunk_hit_ratio"] == pytest.approx(0.5)
        assert out[1]["predicted_chunk_hit_ratio"] == pytest.approx(second_hits)
