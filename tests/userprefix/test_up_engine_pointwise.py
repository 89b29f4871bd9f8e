"""The engine's pointwise scorer: user side + one block per candidate through the selective
prefill, item chunks reused inside the blocks, the user side from the user-prefix cache."""

import dataclasses

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


def _entry(eng, case):
    return eng.user_prefixes.latest(case.user_id)


def _stored_engine(loaded, ds, case, history=None):
    """A pointwise engine whose store holds the case's history (or `history`) and item KV."""
    eng = _engine(loaded, ds)
    eng.build_history(history or case.history)
    eng.build_items(case.candidates)
    return eng


def _exact_side(eng, case, history=None):
    from rcllm.userprefix.scoring import compute_prefix

    side = eng.pointwise.user_side(case.user_id, history or case.history)
    return compute_prefix(eng.model, side.ids)


def test_user_side_reuse_stores_what_it_served_and_marks_it_approximate(tiny_loaded, workload):
    ds, cases = workload
    case = cases[0]
    eng = _stored_engine(tiny_loaded, ds, case)
    miss = eng.rank(_req(case), "naive", keep_tensors=True)
    assert miss.stats["user_prefix"] == "miss" and miss.stats["reused_tokens"]["history"] > 0
    entry = _entry(eng, case)
    assert entry is not None and not entry.exact
    hit = eng.rank(_req(case), "naive", keep_tensors=True)
    assert hit.stats["user_prefix"] == "hit"
    assert (hit.logits - miss.logits).abs().max().item() < 1e-4  # served as stored


def test_user_side_behind_serves_the_miss_fast_and_caches_it_exactly(tiny_loaded, workload):
    """user_side "behind": the miss is answered from reused history chunks (as "reuse"), the
    exact user side is stored after the answer, and the next request gets it; an approximate
    entry already in the cache is not served but replaced."""
    ds, cases = workload
    case = cases[0]
    eng = _stored_engine(tiny_loaded, ds, case)
    reused = eng.rank(_req(case), "naive", keep_tensors=True)        # stores an approximate one
    assert not _entry(eng, case).exact
    miss = eng.rank(_req(case), "naive", keep_tensors=True, user_side="behind")
    assert miss.stats["user_prefix"] == "miss"                        # approximate: not served
    assert (miss.logits - reused.logits).abs().max().item() < 1e-4   # the miss path as "reuse"
    entry = _entry(eng, case)
    assert entry.exact and entry.appends == 0
    want = _exact_side(eng, case)
    got = entry.stored.load(eng.model.dtype, "cpu")
    assert (got.k - want.k).abs().max().item() < 1e-4
    assert (got.v - want.v).abs().max().item() < 1e-4
    hit = eng.rank(_req(case), "naive", keep_tensors=True, user_side="behind")
    assert hit.stats["user_prefix"] == "hit"
    assert hit.stats["reused_tokens"]["history"] == 0
    # the hit is the trained path: exact user side, reused item chunks
    exact = eng.rank(_req(case), "naive", keep_tensors=True, user_side="exact",
                     user_prefix=False)
    assert exact.stats["reused_tokens"]["history"] == 0
    assert exact.stats["reused_tokens"]["item"] > 0
    assert (hit.logits - exact.logits).abs().max().item() < 1e-3
    assert (hit.logits - miss.logits).abs().max().item() > 1e-3      # and not the miss path


def test_user_side_behind_appends_exactly_to_an_exact_entry(tiny_loaded, workload):
    ds, cases = workload
    case = cases[1]
    longer_history = case.history + case.history[:1]
    eng = _stored_engine(tiny_loaded, ds, case, longer_history)
    eng.rank(_req(case), "naive", user_side="behind")
    longer = RankRequest(case.user_id, longer_history, case.candidates)
    res = eng.rank(longer, "naive", user_side="behind")
    assert res.stats["user_prefix"] == "append"
    entry = _entry(eng, case)
    assert entry.exact and entry.appends == 1 and entry.entries == len(longer_history)
    want = _exact_side(eng, case, longer_history)
    got = entry.stored.load(eng.model.dtype, "cpu")
    assert (got.k - want.k).abs().max().item() < 1e-4
    # appends in a row are bounded by userprefix.refresh_every: then the user side is anew
    longest = RankRequest(case.user_id, longer_history + case.history[1:2], case.candidates)
    eng.build_history(longest.history)
    eng.user_prefixes.cfg = dataclasses.replace(eng.user_prefixes.cfg, refresh_every=1)
    assert eng.rank(longest, "naive", user_side="behind").stats["user_prefix"] == "miss"
    assert _entry(eng, case).appends == 0 and _entry(eng, case).exact
    # an approximate entry is no base for an exact user side: that request is a miss
    eng.user_prefixes.invalidate_user(case.user_id)
    eng.rank(_req(case), "naive")
    assert eng.rank(longer, "naive", user_side="behind").stats["user_prefix"] == "miss"
    # "reuse" takes any base
    eng.user_prefixes.invalidate_user(case.user_id)
    eng.rank(_req(case), "naive")
    assert eng.rank(longer, "naive").stats["user_prefix"] == "append"


def test_user_side_exact_computes_the_user_side_in_the_request(tiny_loaded, workload):
    ds, cases = workload
    case = cases[2]
    eng = _stored_engine(tiny_loaded, ds, case)
    full = eng.rank(_req(case), "full", keep_tensors=True)
    res = eng.rank(_req(case), "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=0.0,
                   user_side="exact")
    assert res.stats["user_prefix"] == "miss"
    assert res.stats["reused_tokens"]["history"] == 0 and res.stats["chunk_misses"] == 0
    assert (full.logits - res.logits).abs().max().item() < 1e-3
    assert _entry(eng, case).exact
    hit = eng.rank(_req(case), "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=0.0,
                   user_side="exact")
    assert hit.stats["user_prefix"] == "hit"
    assert (full.logits - hit.logits).abs().max().item() < 1e-3


def test_prewarm_replaces_an_approximate_user_side(tiny_loaded, workload):
    ds, cases = workload
    case = cases[0]
    eng = _stored_engine(tiny_loaded, ds, case)
    eng.rank(_req(case), "naive")
    assert not _entry(eng, case).exact
    assert eng.prewarm(case.user_id, case.history)["computed"]
    assert _entry(eng, case).exact


def test_bad_user_side_is_refused(tiny_loaded, workload):
    ds, cases = workload
    eng = _engine(tiny_loaded, ds)
    with pytest.raises(RcllmError, match="user_side"):
        eng.rank(_req(cases[0]), "naive", user_side="sometimes")


def test_block_budget_recomputes_every_candidate_alike(tiny_loaded, workload):
    """reuse.budget_scope "block": each candidate block recomputes round(ratio × its reused
    item tokens) at layer 1, where "prompt" spreads one budget over all of them; at 1.0 both
    equal full."""
    ds, cases = workload
    case = cases[0]
    eng = _stored_engine(tiny_loaded, ds, case)

    def per_block(res):
        out = {}
        for t in res.explain["tokens"]:
            if t["kind"] == "item" and t["source"] == "chunk":
                n, r = out.get(t["block"], (0, 0))
                out[t["block"]] = (n + 1, r + t["recomputed"])
        return out

    opts = dict(item_ratio=0.3, history_ratio=0.0, user_prefix=False, explain=True)
    block = per_block(eng.rank(_req(case), "rcllm", budget_scope="block", **opts))
    assert len(block) == len(case.candidates)
    assert all(r == round(0.3 * n) for n, r in block.values())
    pooled = per_block(eng.rank(_req(case), "rcllm", budget_scope="prompt", **opts))
    total = sum(n for n, _ in pooled.values())
    assert sum(r for _, r in pooled.values()) == round(0.3 * total)
    full = eng.rank(_req(case), "full", keep_tensors=True)
    exact = eng.rank(_req(case), "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=1.0,
                     budget_scope="block", user_prefix=False)
    assert (full.logits - exact.logits).abs().max().item() < 1e-3
    with pytest.raises(RcllmError, match="budget_scope"):
        eng.rank(_req(case), "rcllm", budget_scope="candidate")
