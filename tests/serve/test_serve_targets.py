"""The sweep's headline read off its cells (loadgen/targets.py) and a sweep re-read at
another SLO (`bench serve --report`): pure functions of the cells' request rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rcllm.loadgen.cells import cell_metrics
from rcllm.loadgen.targets import format_targets, reread, sweep_targets
from rcllm.errors import RcllmError


def _cell(method: str, policy: str, rate: float, latencies_ms: list[float], slo_ms: float,
          wall_s: float = 10.0) -> dict:
    rows = [{"status": 200, "latency_ms": x, "ttft_ms": x, "total_ms": x, "instance": 0,
             "hits": 0, "lookups": 0} for x in latencies_ms]
    return {"rate_rps": rate, "series": f"{method} @ {policy}", "method": method,
            "policy": policy, "requests": rows, **cell_metrics(rows, wall_s, slo_ms)}


def _sweep(slo_ms: float) -> list[dict]:
    cells = []
    for rate, slow in ((0.1, 1.0), (0.2, 1.6), (0.4, 4.0)):
        cells.append(_cell("prefix", "load-only", rate, [3000 * slow] * 9 + [4000 * slow], slo_ms))
        cells.append(_cell("full", "load-only", rate, [3100 * slow] * 10, slo_ms))
        cells.append(_cell("rcllm-0.3/0.3", "affinity", rate, [1000] * 9 + [2000], slo_ms))
        cells.append(_cell("rcllm-0.3/0.3", "hit-only", rate, [1000] * 9 + [2500], slo_ms))
        cells.append(_cell("rcllm-0.3/0.3", "load-only", rate, [1000] * 9 + [1500 if rate < 0.3 else 3000], slo_ms))
    return cells


def test_the_verdict_is_taken_where_prefix_last_meets_the_slo():
    t = sweep_targets(_sweep(7000.0), 7000.0)
    # prefix's P99 ~ 4000 / 6400 / 16000 ms: it meets 7 s at 0.1 and 0.2 rps, not at 0.4
    assert t["baseline_meets_slo_at_rps"] == 0.2
    p99 = [np.percentile(x, 99) for x in ([4800] * 9 + [6400], [1000] * 9 + [2000])]
    assert t["p99_lower_than_baseline"]["rcllm-0.3/0.3"] == pytest.approx(p99[0] / p99[1])
    # goodput: best over the rates of answered-within-SLO per second (10 requests in 10 s)
    assert t["goodput_at_slo_rps"]["rcllm-0.3/0.3"] == pytest.approx(1.0)
    assert t["goodput_at_slo_rps"]["prefix"] == pytest.approx(1.0)
    top = t["policies_at_top_rates"]
    assert [p["rate_rps"] for p in top] == [0.2, 0.4]
    assert [p["affinity_lowest"] for p in top] == [False, True]   # load-only lower at 0.2
    text = format_targets(t)
    assert "0.200 rps" in text and "rcllm-0.3/0.3: 3.28 (met" in text
    assert "    full: 1.26\n" in text            # shown, never judged
    # the lossless peer (exact-user, behind a relay) is shown beside prefix, never judged
    cells = _sweep(7000.0) + [_cell("exact-user", "user-side", 0.2, [2000] * 10, 7000.0)]
    text = format_targets(sweep_targets(cells, 7000.0))
    assert f"    exact-user: {p99[0] / 2000:.2f}\n" in text and "rcllm-0.3/0.3: 3.28 (met" in text


def test_no_rate_meets_the_slo_is_said_not_hidden():
    t = sweep_targets(_sweep(1000.0), 1000.0)
    assert t["baseline_meets_slo_at_rps"] is None and t["p99_lower_than_baseline"] == {}
    assert "at no swept rate" in format_targets(t)
    assert t["goodput_vs_baseline"]["rcllm-0.3/0.3"] == float("inf")  # prefix answered none


def test_a_rejected_request_means_prefix_does_not_meet_the_slo():
    cells = _sweep(7000.0)
    cells[0]["rejected_429"] = 1          # prefix at 0.1 rps refused one
    assert sweep_targets(cells, 7000.0)["baseline_meets_slo_at_rps"] == 0.2
    cells[5]["rejected_429"] = 1          # prefix at 0.2 rps refused one too
    assert sweep_targets(cells, 7000.0)["baseline_meets_slo_at_rps"] is None


def test_reread_recomputes_the_slo_numbers_and_never_writes_over_its_source(tmp_path):
    src = tmp_path / "run"
    src.mkdir()
    cells = _sweep(5000.0)
    (src / "sweep.partial.json").write_text(json.dumps({"capacity_rps": 0.2, "cells": cells}))
    got = reread(str(src / "sweep.partial.json"), 3500.0, str(tmp_path / "out"))
    prefix = [c for c in got["cells"] if c["method"] == "prefix"]
    assert [c["slo_attainment"] for c in prefix] == [0.9, 0.0, 0.0]
    assert got["slo_ms"] == 3500.0 and got["trace"] == {"requests": 10}
    (src / "sweep.json").write_text(json.dumps({"name": "bench.serve.sweep", "cells": cells}))
    with pytest.raises(RcllmError, match="holds the sweep being read"):
        reread(str(src / "sweep.json"), 3500.0, str(src))
    with pytest.raises(RcllmError, match="no such file"):
        reread(str(src / "missing.json"), 3500.0, str(tmp_path / "out"))
    (src / "other.json").write_text(json.dumps({"name": "eval", "rows": []}))
    with pytest.raises(RcllmError, match="not a sweep"):
        reread(str(src / "other.json"), 3500.0, str(tmp_path / "out"))


def _policy_cell(policy: str, rate: float, latencies_ms: list[float], missed: int) -> dict:
    rows = [{"status": 200, "latency_ms": x, "ttft_ms": x, "total_ms": x, "instance": 0,
             "hits": 0, "lookups": 0, "item_tokens": 100, "item_miss_tokens": missed}
            for x in latencies_ms]
    return {"rate_rps": rate, "series": f"rcllm-0.15/0.15 @ {policy}", "policy": policy,
            "method": "rcllm-0.15/0.15", "roles": ["policy"], "requests": rows,
            **cell_metrics(rows, 10.0, 5000.0)}


def test_locality_judges_hits_and_p99_intervals_against_load_only():
    """Issue 62's routing targets: affinity or cost +0.10 item-token hits over load-only, and
    a P99 whose interval lies wholly below load-only's, at the two highest rates."""
    rng = np.random.default_rng(0)
    cells = []
    for rate in (0.3, 0.45, 0.6):
        cells.append(_policy_cell("load-only", rate, list(rng.uniform(3000, 9000, 60)), 40))
        cells.append(_policy_cell("affinity", rate, list(rng.uniform(500, 1500, 60)), 25))
        cells.append(_policy_cell("cost", rate, list(rng.uniform(2500, 9500, 60)), 38))
    t = sweep_targets(cells, 5000.0)
    got = {(x["rate_rps"], x["policy"]): x for x in t["locality"]}
    assert set(got) == {(r, p) for r in (0.45, 0.6) for p in ("affinity", "cost")}
    aff, cost = got[(0.6, "affinity")], got[(0.6, "cost")]
    assert aff["hit_gain"] == pytest.approx(0.15) and aff["hit_gain_met"]
    assert aff["p99_below_apart"] is True
    assert cost["hit_gain"] == pytest.approx(0.02) and not cost["hit_gain_met"]
    assert cost["p99_below_apart"] is False
    text = format_targets(t)
    assert "affinity against load-only: item-token hits +0.150 (target +0.1: met)" in text
    assert "cost against load-only: item-token hits +0.020 (target +0.1: missed)" in text
