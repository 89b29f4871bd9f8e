"""The engine's pointwise scorer: user side + one block per candidate through the selective
prefill, item chunks reused inside the blocks, the user side from the user-prefix cache."""

import pytest
import torch

from rcllm.config import RcllmConfig, load
from rcllm.engine import Engine
from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.prompt import RankRequest


@pytest.fixture(scope="module")
def workload():
    ds = load_dataset("", "synthetic", num_users=20, num_items=60, seed=3)
    return ds, build_cases(ds, history_window=6, num_negatives=9, seed=0, max_cases=3)


def _engine(loaded, ds):
    return Engine(loaded, ds.items, load(RcllmConfig, None, ["reuse.prefix_insert=false"]),
                  scorer="pointwise")


def _req(case, order=None):
    return RankRequest(case.user_id, case.history, tuple(order or case.candidates))


def _reference(engine, case):
    """Each candidate's yes − no logit from one plain forward over its whole prompt."""
    pw, model = engine.pointwise, engine.model
    side = list(pw.user_side(case.user_id, case.history).ids)
    out = []
    for c in case.candidates:
        ids = torch.tensor(side + list(pw.candidate_ids(c)))
        hidden = model.forward(ids, return_hidden=True)["hidden"]
        yes, no = (hidden @ model.lm_head[[pw.yes_id, pw.no_id]].T).tolist()
        out.append(yes - no)
    return torch.tensor(out)


def test_full_scores_equal_independent_forwards(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[0]
    res = eng.rank(_req(case), "full", keep_tensors=True)
    got = torch.tensor([res.scores[c] for c in case.candidates])
    torch.testing.assert_close(got, _reference(eng, case), rtol=1e-4, atol=1e-4)
    assert res.logits.shape == (len(case.candidates), 2)
    # every candidate's item chunk is in its block
    assert res.stats["tokens_by_kind"]["item"] == sum(
        len(eng.builder.item_chunk(c)) for c in case.candidates)


def test_a_block_never_sees_another_candidate(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[0]
    a = eng.rank(_req(case), "full")
    other = next(i for i in ds.items if i not in case.candidates)
    swapped = case.candidates[:-1] + (other,)
    b = eng.rank(_req(case, swapped), "full")
    for c in case.candidates[:-1]:
        assert abs(a.scores[c] - b.scores[c]) < 1e-4


def test_candidate_order_does_not_change_scores(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[1]
    a = eng.rank(_req(case), "full")
    b = eng.rank(_req(case, reversed(case.candidates)), "full")
    for c in case.candidates:
        assert abs(a.scores[c] - b.scores[c]) < 1e-4


def test_full_budget_rcllm_equals_full(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    for case in cases:
        eng.build_history(case.history)
        eng.build_items(case.candidates)
        full = eng.rank(_req(case), "full", keep_tensors=True)
        sel = eng.rank(_req(case), "rcllm", keep_tensors=True, item_ratio=1.0,
                       history_ratio=1.0, user_prefix=False)
        # history and item chunks really came from the store, and were all recomputed
        assert sel.stats["reused_tokens"]["item"] == sel.stats["tokens_by_kind"]["item"] > 0
        assert sel.stats["reused_tokens"]["history"] > 0
        assert (full.logits - sel.logits).abs().max().item() < 1e-3
        naive = eng.rank(_req(case), "naive", keep_tensors=True, user_prefix=False)
        assert naive.stats["recomputed_by_kind"]["item"] == 0
        assert naive.stats["recomputed_fraction"] < 0.5


def test_user_side_comes_from_the_user_prefix_cache(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[2]
    full = eng.rank(_req(case), "full", keep_tensors=True)
    first = eng.rank(_req(case), "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=1.0)
    assert first.stats["user_prefix"] == "miss"
    again = eng.rank(_req(case), "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=1.0)
    shared = len(eng.pointwise.user_side(case.user_id, case.history).ids)
    assert again.stats["user_prefix"] == "hit"
    assert again.stats["user_prefix_tokens"] == shared
    # nothing of the user side is computed again; the head and the blocks are
    assert again.stats["recomputed_tokens"] == again.stats["tokens"] - shared
    assert (full.logits - again.logits).abs().max().item() < 1e-3
    # a longer history of the same user: the cached user side is its prefix (exact), the new
    # entries are built after it, and the result equals full's
    longer = RankRequest(case.user_id, case.history + case.history[:1], case.candidates)
    appended = eng.rank(longer, "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=1.0)
    assert appended.stats["user_prefix"] == "append"
    assert appended.stats["user_prefix_tokens"] == shared
    want = eng.rank(longer, "full", keep_tensors=True)
    assert (want.logits - appended.logits).abs().max().item() < 1e-3
    # a history that is not an extension is another key: a miss
    other = eng.rank(RankRequest(case.user_id, case.history[1:], case.candidates), "rcllm")
    assert other.stats["user_prefix"] == "miss"
    # full never reads it
    assert eng.rank(_req(case), "full").stats["user_prefix"] == "off"


def test_unknown_scorer_and_bad_candidates_are_clear(tiny_loaded, workload):
    ds, cases = workload
    with pytest.raises(RcllmError, match="unknown scorer"):
        Engine(tiny_loaded, ds.items, load(RcllmConfig, None, []), scorer="pairwise")
    eng = _engine(tiny_loaded, ds)
    case = cases[0]
    with pytest.raises(RcllmError, match="unknown candidate"):
        eng.rank(_req(case, case.candidates[:-1] + ("no-such-item",)), "full")


def test_prewarm_makes_the_next_ranking_hit_exactly(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[1]
    assert eng.prewarm(case.user_id, case.history)["computed"]
    assert not eng.prewarm(case.user_id, case.history)["computed"]  # already there
    full = eng.rank(_req(case), "full", keep_tensors=True)
    hit = eng.rank(_req(case), "naive", keep_tensors=True)
    assert hit.stats["user_prefix"] == "hit"
    assert (full.logits - hit.logits).abs().max().item() < 1e-3  # no item chunk was stored
    listwise = Engine(tiny_loaded, ds.items, load(RcllmConfig, None, []))
    with pytest.raises(RcllmError, match="pointwise"):
        listwise.prewarm(case.user_id, case.history)


def test_explain_says_where_every_token_came_from(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[0]
    eng.build_items(case.candidates)
    res = eng.rank(_req(case), "rcllm", explain=True, item_ratio=0.5, history_ratio=0.5,
                   user_prefix=False)
    ex = res.explain
    assert len(ex["tokens"]) == res.stats["tokens"]
    items = [t for t in ex["tokens"] if t["kind"] == "item"]
    assert items and all(t["source"] == "chunk" for t in items)
    recomputed = [t for t in items if t["recomputed"]]
    assert len(recomputed) == res.stats["recomputed_by_kind"]["item"] > 0
    assert all(t["deviation"] is not None for t in items)
    assert {t["block"] for t in items} == set(range(1, len(case.candidates) + 1))
    assert ex["tokens"][0]["source"] == "prefix"  # the instruction, from the prefix cache
    assert all(v >= 0 for v in ex["timing_ms"].values())
    assert "".join(t["text"] for t in ex["tokens"]).startswith("<|im_start|>system")


def test_flops_count_the_two_head_rows_the_scorer_reads(tiny_loaded, workload):
    """The pointwise scorer computes the " Yes" and " No" logits only, so its FLOPs (and the
    FLOP bound's full recompute) charge two head rows per candidate, not the vocabulary."""
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    case = cases[0]
    a = eng.model.arch
    res = eng.rank(_req(case), "full")
    st = res.stats
    assert st["flops"] == pytest.approx(st["full_flops"], rel=1e-9)
    whole = 2 * a.hidden_size * a.vocab_size * len(case.candidates)
    two = 2 * a.hidden_size * 2 * len(case.candidates)
    eng.strategy.head_rows = None  # what the accounting charged before: the vocabulary
    wide = eng.rank(_req(case), "full").stats
    assert wide["full_flops"] - st["full_flops"] == pytest.approx(whole - two, rel=1e-6)
