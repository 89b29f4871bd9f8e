"""The synthetic catalogue's long tail fitted on a real one (`rcllm sim run --zipf-from`,
issue 51 item 4) and the instance counts of the projection."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rcllm.commands.sim import _instance_counts
from rcllm.errors import RcllmError
from rcllm.sim.traces import popularity_of, zipf_alpha

ML = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                  "movielens-100k")


@pytest.mark.parametrize("alpha", [0.6, 1.0, 1.4])
def test_the_fit_recovers_the_exponent_of_zipf_counts(alpha):
    counts = np.round(5000 / np.arange(1, 800) ** alpha)
    assert zipf_alpha(counts) == pytest.approx(alpha, abs=0.05)
    # the order of the counts does not matter; items seen once are left out
    shuffled = np.random.default_rng(0).permutation(np.concatenate([counts, np.ones(500)]))
    assert zipf_alpha(shuffled) == pytest.approx(zipf_alpha(counts))


def test_too_few_repeated_items_are_refused():
    with pytest.raises(RcllmError, match="too few"):
        zipf_alpha(np.array([5, 1, 1, 1]))
    with pytest.raises(RcllmError, match="PATH:FORMAT"):
        popularity_of("only-a-path")


def test_instance_counts_are_parsed_and_checked():
    assert _instance_counts("4,10,40") == [4, 10, 40]
    for bad in ("", "4,x", "0,4"):
        with pytest.raises(RcllmError, match="--ks"):
            _instance_counts(bad)


@pytest.mark.skipif(not os.path.isdir(ML), reason="MovieLens 100K is not here")
def test_movielens_long_tail_is_fitted():
    fitted = popularity_of(f"{ML}:movielens")
    assert fitted["items"] > 1600 and fitted["interactions"] > 99_000
    assert 0.3 < fitted["alpha"] < 3.0
