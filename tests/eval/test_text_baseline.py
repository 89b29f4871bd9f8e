"""The text baseline (`bm25`): a candidate whose text shares the history's rare words ranks
first; the scores follow Okapi BM25's formula."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from rcllm.eval.baselines import Bm25, CoOccurrence, baseline_scores, words
from rcllm.eval.protocol import EvalCase
from rcllm.records import HistoryEntry, Item


def _items():
    return {"h": Item("h", "Vintage Guitar Monthly", "for collectors of vintage guitars"),
            "a": Item("a", "Vintage Guitar Review", "amps and pedals"),
            "b": Item("b", "Garden Monthly", "roses and tomatoes"),
            "c": Item("c", "Monthly Cooking", "")}


def test_words_are_lower_cased_letters_and_digits():
    assert words("Vintage-Guitar, 2nd ed.") == ["vintage", "guitar", "2nd", "ed"]


def test_the_candidate_sharing_rare_history_words_wins():
    text = Bm25(_items())
    case = EvalCase("u", (HistoryEntry("h", 5.0, "", 0),), ("b", "a", "c"), "a")
    scores = baseline_scores("bm25", case, CoOccurrence({}), np.random.default_rng(0), text)
    assert int(np.argmax(scores)) == 1
    # "monthly" occurs in three of four items: b and c share only it, and score less than a
    assert scores[0] < scores[1] and scores[2] < scores[1]


def test_a_score_is_okapi_bm25():
    text = Bm25(_items(), k1=1.2, b=0.75)
    query = text.query(["h"])
    assert query["vintage"] == 2 and query["monthly"] == 1
    n, df, tf, length = 4, 2, 1, 6   # "vintage" in h and a; a has 6 words
    avg = (8 + 6 + 5 + 2) / 4   # words in h, a, b, c
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    one = idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / avg))
    only_vintage = text.score(Counter({"vintage": 1}), "a")
    assert only_vintage == pytest.approx(one)


def test_bm25_without_its_index_is_a_clear_error():
    case = EvalCase("u", (HistoryEntry("h", 5.0, "", 0),), ("b", "a"), "a")
    with pytest.raises(ValueError, match="text index"):
        baseline_scores("bm25", case, CoOccurrence({}), np.random.default_rng(0))
