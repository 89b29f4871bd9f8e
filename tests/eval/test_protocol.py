from collections import Counter

import pytest

from rcllm.errors import RcllmError
from rcllm.eval.datasets.synthetic import generate
from rcllm.eval.protocol import (EvalCase, ItemKnnRetriever, build_cases, earlier_cases,
                                 retrieval_recall, split_users)
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


def test_earlier_cases_add_each_users_earlier_targets(ds):
    cases = build_cases(ds, history_window=10, num_negatives=19, seed=0)[:20]
    more = earlier_cases(ds, cases, 3, history_window=10)
    assert more[0] == cases[0] and [c for c in more if c in cases] == cases
    by_user: dict = {}
    for case in more:
        by_user.setdefault(case.user_id, []).append(case)
    for user, got in by_user.items():
        hist = ds.users[user]
        assert len(got) == min(4, len(hist) - 1)   # the last and up to 3 earlier targets
        for j, case in enumerate(got):
            pos = len(hist) - 1 - j
            assert case.target == hist[pos].item_id and case.history == tuple(hist[:pos][-10:])
            assert len(case.candidates) == 20 and case.candidates.count(case.target) == 1
            # no item of the user's whole sequence is a negative, later ones included
            assert not {h.item_id for h in hist} & (set(case.candidates) - {case.target})
    assert earlier_cases(ds, cases, 3) == more and earlier_cases(ds, cases, 0) == cases
    with pytest.raises(RcllmError):
        earlier_cases(ds, cases, -1)


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


def _cooccur() -> Dataset:
    """Users a1..a3 chose x then y; users b1..b3 chose p then q; u chose x, then its target y."""
    items = {ItemId(k): Item(ItemId(k), k) for k in ("x", "y", "p", "q", "z1", "z2", "z3")}
    e = lambda item, t: HistoryEntry(ItemId(item), 5, "", t)  # noqa: E731
    users = {UserId(f"a{k}"): [e("x", 1), e("y", 2), e("z1", 3)] for k in range(3)}
    users.update({UserId(f"b{k}"): [e("p", 1), e("q", 2), e("z2", 3)] for k in range(3)})
    users[UserId("u")] = [e("x", 1), e("y", 2)]
    users[UserId("v")] = [e("p", 1), e("z3", 2)]
    return Dataset("cooc", items, users)


def test_retrieval_candidates_come_from_cooccurrence():
    ds = _cooccur()
    cases = {c.user_id: c for c in build_cases(ds, num_negatives=1,
                                               candidate_source="retrieval")}
    # u's past is x; y co-occurs with x in a0..a2's pasts: retrieved at rank 1
    u = cases["u"]
    assert u.target == "y" and u.target_retrieved is True
    assert len(u.candidates) == 2 and "x" not in u.candidates and "y" in u.candidates
    # v's past is p -> q is retrieved, the target z3 never co-occurs: a retriever miss, kept
    v = cases["v"]
    assert v.target == "z3" and v.target_retrieved is False
    assert set(v.candidates) == {"z3", "q"}
    assert retrieval_recall(list(cases.values())) == pytest.approx(
        sum(c.target_retrieved for c in cases.values()) / len(cases))
    # popularity candidates carry no retrieval flag
    assert all(c.target_retrieved is None for c in build_cases(ds, num_negatives=1))
    assert retrieval_recall(build_cases(ds, num_negatives=1)) is None


def test_retriever_never_counts_a_target():
    ds = _cooccur()
    r = ItemKnnRetriever(ds)
    # z1 is only ever a last entry (a target): no co-occurrence, no popularity
    assert r.scores(["x"])[r.index["z1"]] == 0.0 and r.popularity[r.index["z1"]] == 0
    # pasts holding x: a0..a2, u (4); holding y: a0..a2 (3); both: 3 -> cosine 3 / sqrt(12)
    assert r.scores(["x"])[r.index["y"]] == pytest.approx(3 / 12 ** 0.5)
    only_b = ItemKnnRetriever(ds, [UserId("b0")])
    assert only_b.scores(["x"]).max() == 0.0 and only_b.scores(["p"])[only_b.index["q"]] > 0
    with pytest.raises(RcllmError):
        ItemKnnRetriever(ds, [UserId("nobody")])


def test_retrieval_cases_well_formed_and_bad_source(ds):
    cases = build_cases(ds, num_negatives=19, candidate_source="retrieval")
    assert len(cases) == len(ds.users)
    for case in cases:
        hist = ds.users[case.user_id]
        assert len(set(case.candidates)) == 20 and case.candidates.count(case.target) == 1
        assert not {h.item_id for h in hist[:-1]} & (set(case.candidates) - {case.target})
    assert 0.0 < retrieval_recall(cases) < 1.0
    with pytest.raises(RcllmError, match="candidate source"):
        build_cases(ds, candidate_source="bm25")
