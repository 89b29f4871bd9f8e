"""`bench ttft`: every method of a request sees the same chunk misses (issue 18, item 1)."""

import pytest

from rcllm.bench.ttft import prepare_caches, run_ttft
from rcllm.commands.common import default_variants
from rcllm.config import RcllmConfig, load
from rcllm.engine import REUSE_METHODS, Engine
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases


@pytest.fixture(scope="module")
def workload():
    ds = load_dataset("", "synthetic", num_users=20, num_items=60, seed=3)
    cases = build_cases(ds, history_window=6, num_negatives=7, seed=0, max_cases=3)
    return ds, cases


@pytest.mark.parametrize("cache_misses", [True, False])
def test_every_method_pays_for_the_new_review(tiny_loaded, workload, cache_misses):
    ds, cases = workload
    eng = Engine(tiny_loaded, ds.items,
                 load(RcllmConfig, None, [f"reuse.cache_misses={str(cache_misses).lower()}"]))
    prepare_caches(eng, cases, new_reviews=1)
    _, records = run_ttft(eng, cases, default_variants())
    reuse = [r for r in records if r["method"] in REUSE_METHODS]
    # every reuse method of the listwise rows (late is a pointwise row: pointwise_variants)
    assert {r["method"] for r in reuse} == set(REUSE_METHODS) - {"late"}
    for case in cases:
        misses = [r["chunk_misses"] for r in reuse if r["user_id"] == case.user_id]
        # the one review not built ahead is a miss for every method, not only the first
        assert misses == [1] * len(misses), misses
    # after the request, the review is stored exactly when the engine would have stored it
    newest = eng.builder.history_chunk(cases[0].history[-1])
    assert eng.store.contains(eng.chunk_key("history", newest)) == cache_misses


def test_bench_ttft_on_retrieved_candidates(tiny_model_dir, tmp_path, capsys):
    import json

    from rcllm.cli import main

    path = tmp_path / "ttft.json"
    assert main(["bench", "ttft", "--set", f"model.path={tiny_model_dir}", "--set",
                 "model.threads=0", "--requests", "3", "--candidates", "4",
                 "--candidate-source", "retrieval", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["config"]["candidate_source"] == "retrieval"
    recall = report["summary"]["retrieval_recall"]
    assert recall is not None and 0.0 <= recall <= 1.0
    assert "retrieved candidates" in capsys.readouterr().out
