"""History prototype library: build budgets, safe files, refusal of foreign or corrupt libraries,
and the engine's use of prototypes (exact at ratio 1.0, exact chunk hits first)."""

import dataclasses
import json

import pytest
import torch

from rcllm.cli import main
from rcllm.config import RcllmConfig, load
from rcllm.engine import Engine
from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.prototypes import BuildOptions, PrototypeLibrary
from rcllm.prototypes.embed import POSITION_DIMS, embed_tokens, position_code
from rcllm.prompt import RankRequest


@pytest.fixture(scope="module")
def setup(tiny_loaded, tmp_path_factory):
    ds = load_dataset("", "synthetic", num_users=20, num_items=60, seed=3)
    cases = build_cases(ds, history_window=6, num_negatives=9, seed=0, max_cases=2)
    test_users = {c.user_id for c in cases}
    eng = Engine(tiny_loaded, ds.items, load(RcllmConfig, None, ["reuse.prefix_insert=false"]))
    corpus = [eng.builder.history_chunk(e) for u, h in ds.users.items() if u not in test_users
              for e in h]
    lib = PrototypeLibrary.build(eng.chunks, corpus, BuildOptions(nbits=10, max_prototypes=600))
    path = tmp_path_factory.mktemp("hist") / "lib.safetensors"
    lib.save(path)
    return ds, cases, eng, lib, path


def _engine(loaded, ds, path, *extra):
    return Engine(loaded, ds.items, load(RcllmConfig, None, [
        "reuse.prefix_insert=false", "reuse.cache_misses=false", f"history.library={path}",
        *extra]))


def test_build_respects_budgets_and_embeddings_are_unit(setup):
    ds, cases, eng, lib, path = setup
    d = lib.describe()
    assert 0 < d["prototypes"] <= 600 and d["prototypes"] <= d["buckets"]
    assert d["corpus_tokens"] > d["prototypes"]
    counts = lib.t["counts"]
    assert (counts[:-1] >= counts[1:]).all()  # most populous buckets kept first
    assert torch.allclose(lib.t["emb"].norm(dim=1), torch.ones(len(lib)), atol=1e-5)
    assert lib.t["k"].dtype == torch.float16
    per = lib.bytes_per_prototype
    small = PrototypeLibrary.build(eng.chunks,
                                   [eng.builder.history_chunk(e) for e in cases[0].history],
                                   BuildOptions(nbits=10, max_bytes=5 * per))
    assert len(small) == 5 and small.nbytes <= 5 * per
    with pytest.raises(RcllmError, match="below one prototype"):
        PrototypeLibrary.build(eng.chunks, [eng.builder.history_chunk(cases[0].history[0])],
                               BuildOptions(max_bytes=per // 2))


def test_prototype_kv_is_the_kv_of_its_source_token(setup):
    ds, cases, eng, lib, path = setup
    # a library over one review keeps, for each prototype, that review's KV at its offset
    ids = eng.builder.history_chunk(cases[0].history[0])
    one = PrototypeLibrary.build(eng.chunks, [ids], BuildOptions(nbits=8, dtype="float32"))
    kv = eng.compute_chunk("history", ids)
    for slot in range(len(one)):
        off = int(one.t["offsets"][slot])
        assert int(one.t["token_ids"][slot]) == ids[off]
        assert torch.allclose(one.t["k"][slot], kv.k[:, :, off], atol=1e-5)
        assert torch.allclose(one.t["v"][slot], kv.v[:, :, off], atol=1e-5)


def test_embedding_mixes_position_by_weight():
    states = torch.randn(2, 32)
    e = embed_tokens(torch.cat((states[:1], states[:1])), torch.tensor([0, 40]),
                     torch.zeros(32), torch.ones(32), 0.1)
    assert e.shape == (2, 32 + POSITION_DIMS)
    p = position_code(torch.tensor([0, 40]))
    # same state, far offsets: cos = 0.9 * 1 + 0.1 * cos(position codes)
    assert float(e[0] @ e[1]) == pytest.approx(0.9 + 0.1 * float(p[0] @ p[1]), abs=1e-5)
    # log-scale offsets: a chunk's first tokens are told apart, deep ones barely
    near = position_code(torch.tensor([0, 1, 20, 21]))
    assert float(near[0] @ near[1]) < 0.5 and float(near[2] @ near[3]) > 0.9


def test_full_budget_with_prototypes_equals_full(tiny_loaded, setup):
    ds, cases, eng, lib, path = setup
    e2 = _engine(tiny_loaded, ds, path, "history.threshold=0.0", "history.search=exact")
    case = cases[0]
    e2.build_items(case.candidates)
    req = RankRequest(case.user_id, case.history, case.candidates)
    full = e2.rank(req, "full", keep_tensors=True)
    sel = e2.rank(req, "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=1.0)
    assert sel.stats["prototype_tokens"] == sel.stats["tokens_by_kind"]["history"]
    assert (full.logits - sel.logits).abs().max().item() < 1e-3
    partial = e2.rank(req, "rcllm", item_ratio=0.3, history_ratio=0.3)
    hist = partial.stats["tokens_by_kind"]["history"]
    assert partial.stats["recomputed_by_kind"]["history"] <= 0.3 * hist + 1
    off = e2.rank(req, "rcllm", prototypes=False)
    assert off.stats["prototype_tokens"] == 0
    assert off.stats["recomputed_by_kind"]["history"] == hist  # new reviews: all fresh


def test_threshold_leaves_unmatched_tokens_fresh(tiny_loaded, setup):
    ds, cases, eng, lib, path = setup
    case = cases[0]
    ids = eng.builder.history_chunk(case.history[0])
    m = lib.match(eng.chunks, ids, threshold=0.99)
    assert torch.equal(m.matched, m.cosine >= 0.99)
    assert (m.k[:, :, ~m.matched] == 0).all()
    e2 = _engine(tiny_loaded, ds, path, "history.threshold=0.99")
    e2.build_items(case.candidates)
    r = e2.rank(RankRequest(case.user_id, case.history, case.candidates), "rcllm")
    expected = sum(int((lib.nearest(e2.chunks, e2.builder.history_chunk(h), "lsh")[0]
                          >= 0.99).sum())
                   for h in case.history)
    assert r.stats["prototype_tokens"] == expected
    assert r.stats["prototype_chunks"] == len(case.history)
    assert r.stats["tokens_by_kind"]["history"] - expected <= r.stats["recomputed_by_kind"]["history"]


def test_exact_chunk_hits_come_before_prototypes(tiny_loaded, setup):
    ds, cases, eng, lib, path = setup
    e2 = _engine(tiny_loaded, ds, path, "history.threshold=0.0")
    case = cases[0]
    e2.build_items(case.candidates)
    e2.build_history(case.history)
    r = e2.rank(RankRequest(case.user_id, case.history, case.candidates), "rcllm")
    assert r.stats["prototype_chunks"] == 0 and r.stats["chunk_misses"] == 0


def test_foreign_or_corrupt_libraries_are_refused(tiny_loaded, setup, tmp_path):
    ds, cases, eng, lib, path = setup
    with pytest.raises(RcllmError, match="another model"):
        PrototypeLibrary.load(path, fingerprint="0" * 64)
    with pytest.raises(RcllmError, match="chunk kind"):
        _engine(tiny_loaded, ds, path, "reuse.chunk_context=none")
    data = bytearray(path.read_bytes())
    bad = tmp_path / "flipped.safetensors"
    data[-100] ^= 0xFF  # a byte inside the tensor data
    bad.write_bytes(bytes(data))
    with pytest.raises(RcllmError, match="checksum"):
        PrototypeLibrary.load(bad)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[: len(data) // 2])
    with pytest.raises(RcllmError, match="corrupt"):
        PrototypeLibrary.load(cut)
    with pytest.raises(RcllmError, match="not found"):
        PrototypeLibrary.load(tmp_path / "missing.safetensors")


def test_cli_build_then_bench(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "lib.safetensors"
    base = ["--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0"]
    assert main(["build-history", *base, "--out", str(out), "--nbits", "8",
                 "--max-reviews", "40"]) == 0
    assert "prototypes" in capsys.readouterr().out
    rep = tmp_path / "bench.json"
    assert main(["bench", "history", *base, "--library", str(out), "--requests", "1",
                 "--candidates", "4", "--sizes", "8,64", "--ratios", "0.3",
                 "--scorer", "verbalizer", "--json", str(rep)]) == 0
    report = json.loads(rep.read_text())
    match = report["summary"]["match"]
    assert set(match["match_rate_lsh"]) == set(match["match_rate_exact"]) == {"0.9", "0.95", "0.99"}
    for t in ("0.9", "0.95", "0.99"):  # a bucket's prototype is never nearer than the nearest
        assert match["match_rate_lsh"][t] <= match["match_rate_exact"][t] + 1e-9
    assert [c["prototypes"] for c in match["size_curve"]] == [8, min(64, report["summary"]["library"]["prototypes"])]
    labels = {r["variant"] for r in report["rows"]}
    assert {"rcllm 0.3/0.3 exact-only", "rcllm 0.3/0.3 +prototypes", "full"} <= labels
    proto = next(r for r in report["rows"] if r["variant"] == "rcllm 0.3/0.3 +prototypes")
    assert 0.0 <= proto["history_recomputed_fraction"] <= 1.0


def test_cli_bad_options_are_clear(tiny_model_dir, tmp_path, capsys):
    base = ["--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0"]
    assert main(["build-history", *base, "--nbits", "0", "--out", str(tmp_path / "x")]) == 2
    assert "nbits" in capsys.readouterr().err
    assert main(["bench", "history", *base, "--library", str(tmp_path / "none")]) == 2
    assert "not found" in capsys.readouterr().err


def test_lsh_lookup_finds_the_bucket_prototype(setup):
    ds, cases, eng, lib, path = setup
    # a corpus token's own bucket holds a prototype; its look-up cosine is never above exact's
    ids = eng.builder.history_chunk(next(e for u, h in ds.users.items()
                                         if u not in {c.user_id for c in cases} for e in h))
    cos_l, idx_l = lib.nearest(eng.chunks, ids, "lsh")
    cos_e, idx_e = lib.nearest(eng.chunks, ids, "exact")
    assert (cos_l <= cos_e + 1e-5).all()
    assert (cos_l > -1).float().mean() > 0.5   # most buckets kept a prototype (600 of them)
    with pytest.raises(RcllmError, match="history.search"):
        lib.nearest(eng.chunks, ids, "fuzzy")
    again = PrototypeLibrary.load(path)
    assert torch.equal(again.nearest(eng.chunks, ids, "lsh")[1], idx_l)  # the index survives the file
