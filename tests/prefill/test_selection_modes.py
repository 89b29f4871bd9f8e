"""rcllm's selections (`reuse.rcllm_select`): blend (deviation + attention), attention alone,
and overlap (no probe: item tokens in runs shared with the history first). Each equals full
recompute at a 100% budget; overlap picks the shared runs before anything else."""

from __future__ import annotations

import pytest
import torch

from rcllm.config import RcllmConfig, ReuseConfig, load
from rcllm.engine import Engine
from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.prefill.layout import Layout
from rcllm.prefill.selection import ITEM, HISTORY, OverlapPolicy, selection_policy, shared_runs
from rcllm.prompt import RankRequest


@pytest.fixture(scope="module")
def workload():
    ds = load_dataset("", "synthetic", num_users=20, num_items=60, seed=3)
    return ds, build_cases(ds, history_window=6, num_negatives=9, seed=0, max_cases=2)


@pytest.mark.parametrize("select", ["attention", "overlap"])
@pytest.mark.parametrize("scorer", ["verbalizer", "pointwise"])
def test_full_budget_equals_full_recompute(tiny_loaded, workload, select, scorer):
    ds, cases = workload
    eng = Engine(tiny_loaded, ds.items, load(RcllmConfig, None, [
        "reuse.prefix_insert=false", "reuse.user_prefix=false", f"reuse.rcllm_select={select}"]),
        scorer=scorer)
    for case in cases:
        eng.build_items(case.candidates)
        eng.build_history(case.history)
        req = RankRequest(case.user_id, case.history, case.candidates)
        full = eng.rank(req, "full", keep_tensors=True)
        sel = eng.rank(req, "rcllm", keep_tensors=True, item_ratio=1.0, history_ratio=1.0)
        assert sel.stats["chunk_hits"] > 0
        assert (full.logits - sel.logits).abs().max().item() < 1e-3
        low = eng.rank(req, "rcllm", item_ratio=0.15, history_ratio=0.15)
        assert low.stats["recomputed_fraction"] < 1.0


def test_shared_runs_need_three_tokens():
    ids = [1, 2, 3, 4, 9, 9, 7, 8, 1, 2, 3, 5, 7, 8, 6]
    #      history 0..8                item chunk 8..15
    assert shared_runs(ids, [(8, 15)], [(0, 8)]) == {8, 9, 10}   # "1 2 3"; "7 8" is too short
    assert shared_runs(ids, [(8, 15)], [(0, 8)], run=2) == {8, 9, 10, 12, 13}


def test_overlap_spends_the_budget_on_shared_runs_first():
    ids = torch.tensor([5, 1, 2, 3, 6, 6, 6, 6, 1, 2, 3])
    n = len(ids)
    kind = torch.tensor([0] + [HISTORY] * 3 + [ITEM] * 7, dtype=torch.int8)
    offset = torch.tensor([0, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6])
    have = torch.tensor([False] + [True] * 10)
    exact = torch.tensor([False] + [True] * 3 + [False] * 7)   # the user side exact
    from types import SimpleNamespace as NS

    inp = NS(ids=ids, kind=kind, offset=offset, have_kv=have, exact_kv=exact,
             layout=Layout.causal(n, ids.device))
    cfg = ReuseConfig(method="rcllm", rcllm_select="overlap", item_ratio=3 / 7, window=1)
    pol = selection_policy(cfg)
    assert isinstance(pol, OverlapPolicy) and not pol.needs_probe
    chosen = pol.static_set(inp)
    assert torch.nonzero(chosen).squeeze(1).tolist() == [8, 9, 10]   # the run "1 2 3"
    cfg = ReuseConfig(method="rcllm", rcllm_select="overlap", item_ratio=4 / 7, window=1)
    chosen = selection_policy(cfg).static_set(inp)
    assert torch.nonzero(chosen).squeeze(1).tolist() == [4, 8, 9, 10]  # then the window


def test_overlap_fill_ends_spreads_the_rest_over_every_chunk():
    """overlap_fill=ends: after the shared runs, each item chunk's last reused token, then the
    one before it, ... round-robin over the chunks — not whole chunks in prompt order."""
    from types import SimpleNamespace as NS

    #              user   hist 1 2 3  | chunk A: 7 1 2 3 8 | chunk B: 4 4 4 4
    ids = torch.tensor([5, 1, 2, 3, 7, 1, 2, 3, 8, 4, 4, 4, 4])
    n = len(ids)
    kind = torch.tensor([0] + [HISTORY] * 3 + [ITEM] * 9, dtype=torch.int8)
    offset = torch.tensor([0, 0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3])
    have = torch.tensor([False] + [True] * 12)
    exact = torch.tensor([False] + [True] * 3 + [False] * 9)
    inp = NS(ids=ids, kind=kind, offset=offset, have_kv=have, exact_kv=exact,
             layout=Layout.causal(n, ids.device))

    def chosen(ratio, fill):
        cfg = ReuseConfig(method="rcllm", rcllm_select="overlap", item_ratio=ratio,
                          overlap_fill=fill)
        return torch.nonzero(selection_policy(cfg).static_set(inp)).squeeze(1).tolist()

    # 5 of 9: the run "1 2 3" (5, 6, 7), then each chunk's last token (8, 12)
    assert chosen(5 / 9, "ends") == [5, 6, 7, 8, 12]
    # 6 of 9: then the next-to-last of the chunk whose last is taken already (11)
    assert chosen(6 / 9, "ends") == [5, 6, 7, 8, 11, 12]
    # order: the run, then the earliest slots (chunk A whole before chunk B)
    assert chosen(5 / 9, "order") == [4, 5, 6, 7, 8]
    with pytest.raises(RcllmError, match="overlap_fill"):
        ReuseConfig(overlap_fill="middle").validate()


def test_bad_selection_is_refused():
    with pytest.raises(RcllmError, match="rcllm_select"):
        ReuseConfig(rcllm_select="random").validate()
