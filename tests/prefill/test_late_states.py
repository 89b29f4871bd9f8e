"""An item built for `late` carries its states entering the late layer on its store entry
(`ChunkKV.states`), through the codec's bytes (Redis and disk tiers) and an instance's export,
so an engine that did not build the item joins it at the late layer without rerunning the
item's lower layers, and scores what the builder scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rcllm.prefill.chunks as chunks_mod
import rcllm.prefill.selective as selective
from rcllm.config import PromptConfig, RcllmConfig, ReuseConfig
from rcllm.engine import Engine
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.kvstore.codec import decode, encode
from rcllm.prompt.builder import RankRequest
from rcllm.serve.host import EngineHost

LATE = 2


def _engine(tiny_loaded, ds, method: str = "late") -> Engine:
    cfg = RcllmConfig(prompt=PromptConfig(history_window=2, max_review_tokens=8,
                                          max_item_tokens=12),
                      reuse=ReuseConfig(method=method, late_layer=LATE, prefix_insert=False,
                                        user_prefix=False, user_side="exact"))
    return Engine(tiny_loaded, ds.items, cfg, scorer="pointwise")


@pytest.fixture(scope="module")
def workload():
    ds = load_dataset("", "synthetic", num_users=6, num_items=20, seed=0)
    return ds, build_cases(ds, history_window=2, num_negatives=4)[:2]


def _scores(eng: Engine, case) -> np.ndarray:
    res = eng.rank(RankRequest(case.user_id, case.history, tuple(case.candidates)), "late")
    assert res.stats.reused_tokens["item"] > 0
    return np.array([res.scores[c] for c in case.candidates])


def _entry(eng: Engine, item):
    return eng.store.get(eng.chunk_key("item", eng.builder.item_chunk(item)))


def _no_recompute(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("an item's states were recomputed")
    monkeypatch.setattr(selective, "block_states", refuse)


def test_a_late_build_carries_the_states_its_recompute_gives(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    items = sorted({c for case in cases for c in case.candidates})
    eng.build_items(items)
    for item in items:
        entry = _entry(eng, item)
        assert entry.states_layer == LATE and entry.states_at(LATE) is not None
        assert entry.states_at(LATE + 1) is None
        again = eng.caches.chunks.states("item", entry.token_ids, LATE)   # recomputed
        torch.testing.assert_close(entry.states, again, rtol=1e-4, atol=1e-5)
        assert entry.nbytes == (entry.k.numel() + entry.v.numel() + entry.states.numel()) * 4
    # a build for another method carries none (its store budget holds KV only)
    other = _engine(tiny_loaded, ds, method="naive")
    other.build_items(items[:1])
    assert _entry(other, items[0]).states is None


@pytest.mark.parametrize("encoding", ["raw", "int8"])
def test_the_states_survive_the_tiers_bytes(tiny_loaded, workload, encoding, monkeypatch):
    ds, cases = workload
    built = _engine(tiny_loaded, ds)
    items = sorted({c for case in cases for c in case.candidates})
    built.build_items(items)
    fetched = _engine(tiny_loaded, ds)
    for item in items:
        key = built.chunk_key("item", built.builder.item_chunk(item))
        got = decode(encode(key, built.store.get(key), encoding), key)
        assert torch.equal(got.states, built.store.get(key).states)
        assert got.states_layer == LATE
        fetched.store.put(key, got)
    _no_recompute(monkeypatch)
    for case in cases:
        want = _scores(built, case)
        tol = 1e-5 if encoding == "raw" else 5e-2
        np.testing.assert_allclose(_scores(fetched, case), want, rtol=tol, atol=tol)


def test_an_instance_imports_the_states_with_the_kv(tiny_loaded, workload, monkeypatch):
    ds, cases = workload
    owner, importer = EngineHost(_engine(tiny_loaded, ds)), EngineHost(_engine(tiny_loaded, ds))
    items = sorted({c for case in cases for c in case.candidates})
    owner.build_items(items)
    rows, _ = owner.export_items(items)
    assert all(len(row) == 5 and row[4] == LATE for row in rows.values())
    with importer.lock:
        assert importer.store_rows(rows) == len(items)
    _no_recompute(monkeypatch)
    for case in cases:
        np.testing.assert_allclose(_scores(importer.engine, case), _scores(owner.engine, case),
                                   rtol=1e-5, atol=1e-5)


def test_a_build_for_another_method_keeps_the_states_beside_the_store(tiny_loaded, workload,
                                                                      monkeypatch):
    """Built for another method (its entries hold KV only), then served by `late`: the
    states the build computed are kept in the builder, so no request recomputes them, and
    the scores equal those of entries built for `late`."""
    ds, cases = workload
    items = sorted({c for case in cases for c in case.candidates})
    late = _engine(tiny_loaded, ds)
    late.build_items(items)
    plain = _engine(tiny_loaded, ds, method="naive")
    plain.build_items(items)
    assert chunks_mod.STATES_KEPT > len(items)
    _no_recompute(monkeypatch)
    for case in cases:
        np.testing.assert_allclose(_scores(plain, case), _scores(late, case),
                                   rtol=1e-5, atol=1e-5)


def test_an_entry_without_states_is_joined_from_recomputed_ones(tiny_loaded, workload):
    """An entry that reached this engine without states (an export from a build for another
    method) has them recomputed once, and scores as one built here for `late`."""
    ds, cases = workload
    items = sorted({c for case in cases for c in case.candidates})
    late = _engine(tiny_loaded, ds)
    late.build_items(items)
    plain = EngineHost(_engine(tiny_loaded, ds, method="naive"))
    plain.build_items(items)
    rows, _ = plain.export_items(items)
    assert all(len(row) == 3 for row in rows.values())
    importer = EngineHost(_engine(tiny_loaded, ds))
    with importer.lock:
        importer.store_rows(rows)
    for case in cases:
        np.testing.assert_allclose(_scores(importer.engine, case), _scores(late, case),
                                   rtol=1e-5, atol=1e-5)
