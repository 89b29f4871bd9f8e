"""A served cell's item-token hit ratio with its 90% interval (issue 62 item 1: "report per
policy the item hit ratio ... with 90% intervals"): the share of the answered requests' item
tokens served from a store, resampled by request."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.loadgen.cells import cell_metrics, ratio_interval


def _row(items, missed, status=200):
    return {"status": status, "latency_ms": 100.0, "ttft_ms": 90.0, "total_ms": 95.0,
            "instance": 0, "hits": 1, "lookups": 2, "fetched": 0, "recomputed_fraction": 1.0,
            "item_tokens": items, "item_miss_tokens": missed}


def test_the_ratio_is_of_the_answered_rows_sums_with_an_interval_around_it():
    rows = [_row(100, 0), _row(100, 50), _row(200, 200), _row(100, 100, status=429)]
    cell = cell_metrics(rows, wall_s=1.0, slo_ms=5000.0)
    assert cell["item_token_hit_ratio"] == pytest.approx(150 / 400)   # the 429 not counted
    lo, hi = cell["item_token_hit_ci90"]
    assert 0.0 <= lo < 150 / 400 < hi <= 1.0


def test_the_interval_narrows_with_more_requests_and_is_exact_when_every_row_agrees():
    rng = np.random.default_rng(1)
    items = np.full(400, 100.0)
    held = rng.binomial(100, 0.6, 400).astype(float)
    wide = np.diff(ratio_interval(held[:20], items[:20]))[0]
    narrow = np.diff(ratio_interval(held, items))[0]
    assert narrow < wide
    assert ratio_interval(np.full(5, 30.0), np.full(5, 60.0)) == [0.5, 0.5]


def test_rows_without_item_tokens_say_nothing():
    row = _row(0, 0)
    cell = cell_metrics([row], wall_s=1.0, slo_ms=5000.0)
    assert cell["item_token_hit_ratio"] is None and cell["item_token_hit_ci90"] is None
