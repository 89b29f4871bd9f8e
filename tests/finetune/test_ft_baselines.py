"""Random, popularity and item-kNN baselines: what they may know and how they score."""

from __future__ import annotations

import numpy as np

from rcllm.eval.baselines import (CoOccurrence, baseline_rows, baseline_scores,
                                  known_interactions)
from rcllm.eval.protocol import EvalCase
from rcllm.records import Dataset, HistoryEntry, Item


def _ds() -> Dataset:
    items = {i: Item(i, f"item {i}") for i in "abcdef"}
    seqs = {"u1": "abc", "u2": "abd", "u3": "abe", "u4": "fa", "t1": "ab"}
    users = {u: [HistoryEntry(i, 5.0, "", k) for k, i in enumerate(s)] for u, s in seqs.items()}
    return Dataset("toy", items, users)


def test_known_interactions_hold_out_last_items_except_training_users():
    known = known_interactions(_ds(), train_users=["u1"])
    assert known["u1"] == list("abc") and known["u2"] == list("ab") and known["t1"] == ["a"]


def test_item_knn_prefers_co_occurring_items_and_popularity_counts():
    ds = _ds()
    co = CoOccurrence(known_interactions(ds, ["u1", "u2", "u3", "u4"]))
    assert co.count["a"] == 5 and co.count["b"] == 3  # t1 counts a, not its target b
    assert co.cosine("a", "b") == 3 / np.sqrt(5 * 3) and co.cosine("b", "f") == 0.0
    case = EvalCase("t1", (ds.users["t1"][0],), ("f", "b", "c"), "b")  # history: a
    rng = np.random.default_rng(0)
    knn = baseline_scores("item_knn", case, co, rng)
    assert int(np.argmax(knn)) == 1  # b co-occurs with a most often
    pop = baseline_scores("popularity", case, co, rng)
    assert int(np.argmax(pop)) == 1 and pop[0] != pop[2]  # jitter breaks the f/c tie


def test_rows_have_means_and_intervals():
    ds = _ds()
    cases = [EvalCase("t1", (ds.users["t1"][0],), ("f", "b", "c"), "b")] * 3
    rows = baseline_rows(ds, cases, ["u1", "u2", "u3", "u4"], ks=(1, 2))
    assert [r["variant"] for r in rows] == ["random", "popularity", "item_knn", "bm25"]
    knn = rows[2]
    assert knn["hr@1"] == 1.0 and knn["requests"] == 3
    for r in rows:
        assert set(r) >= {"hr@1", "ndcg@2", "method", "scorer"}
