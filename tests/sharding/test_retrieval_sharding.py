"""METIS vs random on retrieved candidates, on the real MovieLens 100K trace (issue 18, item 6).

Skipped when the shared data folder is absent."""

from pathlib import Path

import pytest

from rcllm.sharding.report import sweep
from rcllm.sharding.trace import build_trace

ML100K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "movielens-100k"


@pytest.mark.skipif(not ML100K.is_dir(), reason=f"no MovieLens 100K at {ML100K}")
def test_metis_over_random_on_retrieved_candidates_movielens():
    from rcllm.eval.datasets import load_dataset

    ds = load_dataset(str(ML100K), "movielens")
    trace = build_trace(ds, 0.2, 0, candidate_source="retrieval")
    assert trace.candidate_source == "retrieval" and 0.05 < trace.retrieval_recall < 0.5
    metis, random = sweep(trace, [10], ["metis", "random"], 0.001, 0, 1)
    ratio = metis["hit_rate_candidates_nonhot"] / random["hit_rate_candidates_nonhot"]
    assert ratio >= 1.5, ratio
