"""What a served sweep served, scored (issue 60 item 5: "beside the latency, the NDCG@10 of
what was served"): each trace request keeps its reviewed item, each answered row its top ten,
and a cell reports their NDCG@10 with a bootstrap interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rcllm.loadgen.cells import cell_metrics, served_gain, served_quality
from rcllm.loadgen.trace import review_trace
from rcllm.records import Dataset, HistoryEntry, Item


def _row(top10, target, status=200):
    return {"status": status, "latency_ms": 100.0, "ttft_ms": 90.0, "total_ms": 95.0,
            "instance": 0, "hits": 0, "lookups": 0, "fetched": 0, "recomputed_fraction": 1.0,
            "top10": top10, "target": target}


def test_the_gain_is_one_over_log2_of_the_position_plus_two():
    top = [f"i{k}" for k in range(10)]
    assert served_gain(top, "i0") == 1.0
    assert served_gain(top, "i2") == pytest.approx(1 / math.log2(4))
    assert served_gain(top, "i9") == pytest.approx(1 / math.log2(11))
    assert served_gain(top + ["i10"], "i10") == 0.0          # eleventh: outside the top ten
    assert served_gain(top, "x") == 0.0


def test_a_cell_scores_its_answered_rankings_only():
    top = [f"i{k}" for k in range(10)]
    rows = [_row(top, "i0"), _row(top, "i1"), _row(top, "zz"),
            _row([], "i0", status=429)]                       # refused: not scored
    q = served_quality([r for r in rows if r["status"] == 200])
    want = (1.0 + 1 / math.log2(3) + 0.0) / 3
    assert q["served_n"] == 3 and q["served_ndcg10"] == pytest.approx(want)
    assert q["served_hr10"] == pytest.approx(2 / 3)
    lo, hi = q["served_ndcg10_ci90"]
    assert 0.0 <= lo <= want <= hi <= 1.0 and hi > lo
    cell = cell_metrics(rows, wall_s=1.0, slo_ms=5000.0)
    assert cell["served_ndcg10"] == pytest.approx(want) and cell["served_n"] == 3


def test_rows_recorded_before_the_fields_say_nothing():
    row = _row([], "i0")
    del row["top10"]
    assert served_quality([row])["served_ndcg10"] is None


def test_the_trace_keeps_each_request_s_reviewed_item():
    users = {f"u{u}": [HistoryEntry(f"i{(u + k) % 12}", 4.0, f"review {k}", 1000 * u + 10 * k)
                       for k in range(4)] for u in range(6)}
    items = {f"i{k}": Item(f"i{k}", f"item {k}", "text") for k in range(12)}
    ds = Dataset("tiny", items, users)
    tr = review_trace(ds, 10, 5, window="tail")
    assert len(tr.targets) == len(tr.bodies) == 10
    for body, target in zip(tr.bodies, tr.targets):
        # the reviewed item is always among the candidates and never in the history
        assert target in body["candidates"]
        assert target not in [h["item_id"] for h in body["history"]]
    served = [_row(b["candidates"][:10], t) for b, t in zip(tr.bodies, tr.targets)]
    assert np.isfinite(served_quality(served)["served_ndcg10"])
