"""The served headline against the strongest exact peer (loadgen/peers.py, issue 60 item 5):
which peer, at which rate, and the fast path's P99, goodput and served-NDCG ratios there."""

from __future__ import annotations

import pytest

from rcllm.loadgen.cells import cell_metrics
from rcllm.loadgen.peers import peer_headline, strongest_peer
from rcllm.loadgen.targets import format_targets, sweep_targets

SLO = 5000.0
TOP = [f"i{k}" for k in range(10)]


def _cell(method, rate, lat_ms, target_pos, wall_s=10.0, status=200):
    rows = [{"status": status, "latency_ms": float(l), "ttft_ms": float(l), "total_ms": float(l),
             "instance": 0, "hits": 0, "lookups": 0, "fetched": 0, "recomputed_fraction": 1.0,
             "top10": TOP, "target": TOP[p] if p is not None else "zz"}
            for l, p in zip(lat_ms, target_pos)]
    return {"rate_rps": rate, "method": method, "policy": "x", "roles": ["method"],
            **cell_metrics(rows, wall_s, SLO), "requests": rows}


def _own(cells):
    own = {}
    for c in cells:
        own.setdefault(c["method"], {})[c["rate_rps"]] = c
    return own


def test_the_peer_that_meets_the_slo_at_the_highest_rate_is_the_stronger():
    n = 20
    cells = [_cell("prefix", 1.0, [3000] * n, [0] * n), _cell("prefix", 2.0, [9000] * n, [0] * n),
             _cell("exact-user", 1.0, [2000] * n, [0] * n),
             _cell("exact-user", 2.0, [4000] * n, [0] * n)]
    assert strongest_peer(_own(cells), SLO) == ("exact-user", 2.0)
    # nobody meets it: no headline
    assert strongest_peer(_own([_cell("prefix", 1.0, [9000] * n, [0] * n)]), SLO) is None


def test_a_path_twice_as_fast_at_parity_reads_two_and_a_zero_delta():
    n = 40
    peer = _cell("exact-user", 2.0, [4000] * n, [0] * n)
    fast = _cell("late", 2.0, [2000] * n, [0] * n)
    lossy = _cell("rcllm", 2.0, [1000] * n, [None] * n)     # the target never in its top ten
    slow = _cell("naive", 2.0, [6000] * (n // 2) + [1000] * (n // 2), [0] * n)
    h = peer_headline(_own([peer, fast, lossy, slow]), SLO)
    assert h["peer"] == "exact-user" and h["rate_rps"] == 2.0
    late = h["paths"]["late"]
    assert late["p99_ratio"] == pytest.approx(2.0)
    assert late["p99_ratio_ci90"] == pytest.approx([2.0, 2.0])
    assert late["goodput_ratio"] == pytest.approx(1.0)
    assert late["ndcg10_delta"] == 0.0 and late["paired_n"] == n
    assert h["paths"]["rcllm"]["ndcg10_delta"] == pytest.approx(-1.0)
    # half its answers past the SLO: half the peer's goodput
    assert h["paths"]["naive"]["goodput_ratio"] == pytest.approx(0.5)
    lo, hi = h["paths"]["naive"]["goodput_ratio_ci90"]
    assert lo < 0.5 < hi
    assert "exact-user" not in h["paths"] and "full" not in h["paths"]


def test_the_sweep_verdict_carries_and_prints_it():
    n = 20
    cells = [_cell("prefix", 1.0, [3000] * n, [0] * n), _cell("late", 1.0, [1000] * n, [1] * n)]
    t = sweep_targets(cells, SLO)
    assert t["vs_strongest_peer"]["peer"] == "prefix"
    assert t["vs_strongest_peer"]["paths"]["late"]["p99_ratio"] == pytest.approx(3.0)
    text = format_targets(t)
    assert "against the strongest exact peer, prefix" in text and "late: P99 x3.00" in text
