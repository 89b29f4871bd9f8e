from collections import Counter

import pytest

from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.datasets._common import approx_tokens
from rcllm.eval.datasets.synthetic import generate


def test_shape_and_invariants():
    ds = generate(num_users=120, num_items=200, seed=3)
    ds.check_invariants()
    assert len(ds.users) == 120 and len(ds.items) == 200
    assert ds.skipped == {}
    for hist in ds.users.values():
        assert 3 <= len(hist) <= 40
        assert len({h.item_id for h in hist}) == len(hist)  # distinct items per user
        assert all(1.0 <= h.rating <= 5.0 for h in hist)


def test_text_lengths_within_bounds():
    ds = generate(num_users=150, num_items=250, seed=1)
    reviews = [approx_tokens(h.review) for hist in ds.users.values() for h in hist]
    descriptions = [approx_tokens(i.description) for i in ds.items.values()]
    assert min(reviews) >= 20 and max(reviews) <= 80
    assert min(descriptions) >= 40 and max(descriptions) <= 90
    assert all(i.title and i.category for i in ds.items.values())


def test_deterministic_and_seed_dependent():
    a, b, c = generate(50, 80, seed=7), generate(50, 80, seed=7), generate(50, 80, seed=8)
    assert a.items == b.items and a.users == b.users
    assert a.users != c.users


def test_long_tail_popularity_and_communities():
    ds = generate(num_users=300, num_items=300, seed=0)
    counts = Counter(h.item_id for hist in ds.users.values() for h in hist)
    ranked = [n for _, n in counts.most_common()]
    top = sum(ranked[: len(ranked) // 10])
    assert top / sum(ranked) > 0.25  # the top 10% of items take a large share
    # most of a user's items share one category (co-occurring communities)
    shares = []
    for hist in ds.users.values():
        cats = Counter(ds.items[h.item_id].category for h in hist)
        shares.append(cats.most_common(1)[0][1] / len(hist))
    assert sum(shares) / len(shares) > 0.6


def test_phrases_recur_across_users():
    ds = generate(num_users=100, num_items=150, seed=2)
    sentences = Counter(s for hist in ds.users.values() for h in hist
                        for s in h.review.split(". "))
    assert sentences.most_common(1)[0][1] > 50
    assert len(sentences) > 100  # varied, not one review copied


def test_timestamps_have_ties_and_order():
    ds = generate(num_users=200, num_items=200, seed=0)
    ties = sum(1 for hist in ds.users.values()
               for x, y in zip(hist, hist[1:]) if x.timestamp == y.timestamp)
    assert ties > 0


def test_dispatcher_and_bad_arguments():
    ds = load_dataset("", "synthetic", num_users=10, num_items=30, seed=4)
    assert len(ds.users) == 10
    with pytest.raises(RcllmError, match="no option"):
        load_dataset("", "synthetic", users=10)
    with pytest.raises(RcllmError, match="unknown dataset format"):
        load_dataset("", "csv")
    with pytest.raises(RcllmError):
        generate(num_users=0)
