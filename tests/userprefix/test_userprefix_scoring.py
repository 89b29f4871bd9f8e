"""Batched scoring over a cached prefix equals independent full forwards; appends equal a
fresh compute."""

from __future__ import annotations

import torch
from up_helpers import make_ranker

from rcllm.userprefix.append import append_prefix, kv_drift
from rcllm.userprefix.scoring import compute_prefix, score_batched, score_independent
from rcllm.bench.userprefix_workload import long_history, sample_candidates


def test_batched_scores_equal_independent_forwards(tiny_loaded):
    ranker, ds = make_ranker(tiny_loaded)
    user = sorted(ds.users)[0]
    side = ranker.prompt.user_side(user, ds.users[user])
    cands = sample_candidates(ds, 12, seed=1)
    suffixes = [ranker.prompt.candidate_ids(c) for c in cands]
    kv = compute_prefix(ranker.model, side.ids)
    batched = score_batched(ranker.model, kv, suffixes, ranker.prompt.yes_id, ranker.prompt.no_id)
    ref = torch.tensor([score_independent(ranker.model, side.ids, s, ranker.prompt.yes_id,
                                          ranker.prompt.no_id) for s in suffixes])
    assert batched.shape == (12,)
    assert torch.allclose(batched, ref, atol=1e-5), (batched - ref).abs().max()
    assert len(set(batched.tolist())) > 1  # candidates actually differ


def test_batched_scores_with_small_groups(tiny_loaded, monkeypatch):
    """Grouping the block attention by candidates does not change the scores."""
    import rcllm.prefill.layout as layout
    import rcllm.userprefix.scoring as scoring

    ranker, ds = make_ranker(tiny_loaded)
    user = sorted(ds.users)[1]
    side = ranker.prompt.user_side(user, ds.users[user])
    suffixes = [ranker.prompt.candidate_ids(c) for c in sample_candidates(ds, 7, seed=2)]
    kv = compute_prefix(ranker.model, side.ids)
    whole = scoring.score_batched(ranker.model, kv, suffixes, 1, 2)
    monkeypatch.setattr(layout, "GROUP_SLOTS", 40)
    assert len(layout.Layout.after(len(side.ids), [len(s) for s in suffixes])._groups) > 2
    grouped = scoring.score_batched(ranker.model, kv, suffixes, 1, 2)
    assert torch.allclose(whole, grouped, atol=1e-6)


def test_append_equals_fresh_compute(tiny_loaded):
    ranker, ds = make_ranker(tiny_loaded)
    user = sorted(ds.users)[2]
    hist = long_history(ranker.prompt, ds.users[user], 600)
    old = ranker.prompt.user_side(user, hist[:-3])
    new = ranker.prompt.user_side(user, hist)
    assert new.ids[: len(old.ids)] == old.ids  # the user side is append-only
    appended = append_prefix(ranker.model, compute_prefix(ranker.model, old.ids),
                             ranker.prompt.history_ids(hist[-3:]))
    fresh = compute_prefix(ranker.model, new.ids)
    drift = kv_drift(appended, fresh)
    assert drift["k_max_abs"] < 1e-4 and drift["v_max_abs"] < 1e-4, drift


def test_ranker_appends_then_refreshes(tiny_loaded):
    ranker, ds = make_ranker(tiny_loaded, refresh_every=3)
    user = sorted(ds.users)[3]
    hist = long_history(ranker.prompt, ds.users[user], 500)
    cands = sample_candidates(ds, 4, seed=3)
    for n in range(len(hist) - 4, len(hist) + 1):  # 5 history versions
        got = ranker.score(user, hist[:n], cands)
        assert not got.cached
    # versions: full, append ×3, then a full refresh (refresh_every=3)
    assert (ranker.full_computes, ranker.appends) == (2, 3)
    again = ranker.score(user, hist, cands)
    assert again.cached and again.scores == got.scores
    fresh_kv = compute_prefix(ranker.model, ranker.prompt.user_side(user, hist).ids)
    cached_kv, _, _ = ranker.prefix(user, hist)
    assert kv_drift(cached_kv, fresh_kv)["k_max_abs"] < 1e-4
    ranker.cache.check_invariants()


def test_append_on_an_int8_past_drifts_more(tiny_loaded):
    """Why appends are refreshed: over an INT8 past the new tokens see dequantised keys."""
    from rcllm.userprefix.kv import StoredKV

    ranker, ds = make_ranker(tiny_loaded)
    user = sorted(ds.users)[4]
    hist = long_history(ranker.prompt, ds.users[user], 500)
    old = compute_prefix(ranker.model, ranker.prompt.user_side(user, hist[:-2]).ids)
    new_ids = ranker.prompt.history_ids(hist[-2:])
    fresh = compute_prefix(ranker.model, ranker.prompt.user_side(user, hist).ids)
    q8_past = StoredKV.of(old, int8=True).load(old.k.dtype, "cpu")
    exact = kv_drift(append_prefix(ranker.model, old, new_ids), fresh)
    lossy = kv_drift(append_prefix(ranker.model, q8_past, new_ids), fresh)
    assert lossy["k_rel"] > 10 * exact["k_rel"]
