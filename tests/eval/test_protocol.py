from collections import Counter

import pytest

from rcllm.errors import RcllmError
from rcllm.eval.datasets.synthetic import generate
from rcllm.eval.protocol import EvalCase, build_cases, split_users
from rcllm.records import Dataset, HistoryEntry, Item, ItemId, UserId


@pytest.fixture(scope="module")
def ds() -> Dataset:
    return generate(num_users=150, num_items=200, seed=5)


def test_cases_are_well_formed(ds):
    cases = build_cases(ds, history_window=10, num_negatives=19, seed=0)
    assert len(cases) == len(ds.users)
    for case in cases:
        hist = ds.users[case.user_id]
        assert case.target == hist[-1].item_id
        assert case.history == tuple(hist[:-1][-10:])
        assert len(case.candidates) == 20 and len(set(case.candidates)) == 20
        assert case.candidates.count(case.target) == 1
        assert case.candidates[case.target_index] == case.target
        seen = {h.item_id for h in hist}
        assert not seen & (set(case.candidates) - {case.target})


def test_deterministic_and_seeded(ds):
    a = build_cases(ds, seed=1)
    assert a == build_cases(ds, seed=1)
    b = build_cases(ds, seed=2)
    assert {c.user_id: c.candidates for c in a} != {c.user_id: c.candidates for c in b}
    # a user's case does not depend on max_cases
    few = build_cases(ds, seed=1, max_cases=10)
    full = {c.user_id: c for c in a}
    assert len(few) == 10 and all(full[c.user_id] == c for c in few)


def test_candidates_are_shuffled(ds):
    positions = Counter(c.target_index for c in build_cases(ds, seed=0))
    assert len(positions) > 10  # the target is not always in the same slot


def test_negatives_follow_popularity(ds):
    pop = Counter(h.item_id for hist in ds.users.values() for h in hist)
    negs = Counter(n for c in build_cases(ds, seed=0) for n in c.candidates if n != c.target)
    top = {i for i, _ in pop.most_common(20)}
    tail = {i for i, _ in pop.most_common()[-40:]}
    assert sum(negs[i] for i in top) > 3 * sum(negs[i] for i in tail)
    assert all(pop[i] > 0 for i in negs)  # enough popular items: no zero-count filler


def _tiny(n_items: int) -> Dataset:
    items = {ItemId(f"i{k}"): Item(ItemId(f"i{k}"), f"t{k}") for k in range(n_items)}
    users = {UserId("a"): [HistoryEntry(ItemId("i0"), 5, "", 1), HistoryEntry(ItemId("i1"), 4, "", 1)],
             UserId("b"): [HistoryEntry(ItemId("i2"), 3, "", 5)],
             UserId("c"): [HistoryEntry(ItemId("i0"), 5, "", 2), HistoryEntry(ItemId("i2"), 1, "", 3)]}
    return Dataset("tiny", items, users)


def test_skips_are_counted_and_ties_use_list_order():
    skipped: dict[str, int] = {}
    cases = build_cases(_tiny(6), num_negatives=3, skipped=skipped)
    assert skipped == {"short_history": 1}
    by_user = {c.user_id: c for c in cases}
    assert by_user["a"].target == "i1"  # equal timestamps: the later list entry is the target
    assert set(by_user["a"].candidates) - {"i1"} <= {"i2", "i3", "i4", "i5"}
    # zero-count items fill up when popular ones run out
    assert "i3" in by_user["a"].candidates or "i4" in by_user["a"].candidates
    skipped = {}
    assert build_cases(_tiny(4), num_negatives=3, skipped=skipped) == []
    assert skipped == {"short_history": 1, "too_few_negatives": 2}


def test_bad_arguments(ds):
    with pytest.raises(RcllmError):
        build_cases(ds, history_window=0)


def test_split_users_is_a_deterministic_partition(ds):
    train, val, test = split_users(ds, (0.8, 0.1, 0.1), seed=3)
    assert (len(train), len(val), len(test)) == (120, 15, 15)
    assert sorted(train + val + test) == sorted(ds.users)
    assert (train, val, test) == split_users(ds, (0.8, 0.1, 0.1), seed=3)
    assert train != split_users(ds, (0.8, 0.1, 0.1), seed=4)[0]
    with pytest.raises(RcllmError):
        split_users(ds, (0.5, 0.6))


def test_evalcase_is_frozen(ds):
    case = build_cases(ds, max_cases=1)[0]
    assert isinstance(case, EvalCase)
    with pytest.raises(AttributeError):
        case.target = ItemId("x")  # type: ignore[misc]
