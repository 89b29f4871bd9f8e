"""The diagnostics' paths (`finetune.diagnose`) and the prefill's late join they rest on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rcllm.eval.protocol import build_cases
from rcllm.finetune.diagnose import Diagnoser, case_part, diagnose, table
from rcllm.prefill.selective import Frozen, prefill
from rcllm.prompt.builder import RankRequest


@pytest.fixture
def setup(tiny_pointwise, fav_dataset):
    cases = build_cases(fav_dataset, history_window=2, num_negatives=3)[:4]
    return *tiny_pointwise, cases, fav_dataset


@pytest.mark.parametrize("s", [1, 2])
def test_join_with_the_full_pass_states_is_the_full_pass(setup, s):
    """Slots joined at layer s with the KV below s and the states entering s that the full
    pass itself made give the full pass's scores exactly: the join adds nothing of its own."""
    model, pw, cases, _ = setup
    d = Diagnoser(model, pw, tail=0)
    case = cases[0]
    prompt = pw.prompt(RankRequest(case.user_id, case.history, tuple(case.candidates)))
    ids, ranges = list(prompt.token_ids), []
    for item, tail in prompt.blocks:
        ranges.append((len(ids), len(ids) + len(item.token_ids) + len(tail.token_ids)))
        ids += list(item.token_ids) + list(tail.token_ids)
    ref = d._inputs(ids, ranges)
    full = prefill(model, ref, d._naive, capture=s)
    inp = d._inputs(ids, ranges)
    items = torch.cat([torch.arange(a, a + len(b[0].token_ids))
                       for (a, _), b in zip(ranges, prompt.blocks)])
    for layer in range(model.arch.num_layers):
        inp.k_buf[layer][:, items] = ref.k_buf[layer][:, items]
        inp.v_buf[layer][:, items] = ref.v_buf[layer][:, items]
        if layer >= s:  # above the join the buffers must not matter: poison them
            inp.k_buf[layer][:, items] = 1e3
    inp.have_kv[items] = True
    h = full.frozen.h[torch.searchsorted(full.frozen.idx, items)]
    got = prefill(model, inp, d._naive, join=[Frozen(s, items, h)])
    torch.testing.assert_close(got.hidden_out, full.hidden_out, rtol=1e-4, atol=1e-4)
    assert got.flops < full.flops  # the item slots were not computed below s
    with pytest.raises(ValueError):  # a joined slot must hold reused KV
        prefill(model, d._inputs(ids, ranges), d._naive, join=[Frozen(s, items, h)])


def test_paths_meet_their_exact_ends(setup):
    """late@0 is full, late@L is the fast path without a tail; full and fast equal the
    trainer's paths (which tests pin to the engine); swapped paths read the other history."""
    from rcllm.finetune.paths import PathScorer

    model, pw, cases, _ = setup
    L = model.arch.num_layers
    d = Diagnoser(model, pw, tail=0, depths=(0, 1, L))
    case, other = cases[0], cases[1]
    got = d.score_case(case, other)
    assert set(got) == set(d.paths())
    np.testing.assert_allclose(got["late@0"], got["full"])
    np.testing.assert_allclose(got[f"late@{L}"], got["fast"], rtol=1e-4, atol=1e-4)
    ps = PathScorer(model, pw, 0)
    with torch.no_grad():
        want = ps.score(case.user_id, case.history, tuple(case.candidates), ("full", "reuse"))
        swapped = ps.score(other.user_id, other.history, tuple(case.candidates),
                           ("full", "reuse"))
    np.testing.assert_allclose(got["full"], want.scores["full"].numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["fast"], want.scores["reuse"].numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["full_user_swapped"], swapped.scores["full"].numpy(),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["fast_user_swapped"], swapped.scores["reuse"].numpy(),
                               rtol=1e-4, atol=1e-4)
    # the in-between depth and the foreign and short paths really differ from full
    for p in ("late@1", "foreign", "short"):
        assert np.abs(got[p] - got["full"]).max() > 1e-5, p


def test_diagnose_table_rows(setup):
    model, pw, cases, ds = setup
    d = Diagnoser(model, pw, tail=1, depths=(2,))
    rows = {r["path"]: r for r in table(diagnose(d, cases, ds.items))}
    assert rows["full"]["delta_vs_full"] == 0.0 and rows["full"]["top1_agreement"] == 1.0
    assert "user_swap_drop" in rows["fast_user_swapped"]
    assert sum(rows["full"][f"n_{p}"] for p in ("same_item", "same_brand", "neither")) == 4


def test_case_part_reads_titles():
    from types import SimpleNamespace as NS

    from rcllm.records import HistoryEntry, Item

    items = {i.item_id: i for i in (
        Item("a", "Hearst — Cosmo is the mag", "", ""), Item("b", "Hearst — Cosmo is the mag", "", ""),
        Item("c", "Hearst — Elle is another", "", ""), Item("d", "Conde — Vogue", "", ""))}

    def case(target, hist):
        return NS(target=target, history=tuple(HistoryEntry(h, 5.0, "", 0) for h in hist))

    assert case_part(case("b", ["a"]), items) == "same_item"
    assert case_part(case("c", ["a"]), items) == "same_brand"
    assert case_part(case("d", ["a", "c"]), items) == "neither"


def test_choose_fast_path_takes_the_fastest_within_the_tolerance():
    from types import SimpleNamespace as NS

    from rcllm.finetune.choice import choose_fast_path

    good, bad = np.array([3.0, 0, 0, 0]), np.array([0, 3.0, 0, 0])   # target at index 0

    class Fake:
        tail, depths, ratios = 1, (25, 20, 10), (0.15, 0.3)
        model = NS(arch=NS(num_layers=30))

        def __init__(self, ok):
            self.ok = ok

        def score_case(self, case, other, only):
            return {p: good if p in self.ok else bad for p in only}

    cases = [NS(candidates=("a", "b", "c", "d"), target="a", user_id=u) for u in "uvw"]
    got = choose_fast_path(Fake({"full", "late@20", "late@10"}), cases)
    assert (got["method"], got["late_layer"], got["within"]) == ("late", 20, True)
    assert choose_fast_path(Fake({"full", "fast", "late@10"}), cases)["method"] == "naive"
    # tried by the share of item work computed: overlap@0.15 (0.15) before late@25 (5/30)
    # and overlap@0.3 before late@20 (10/30)
    got = choose_fast_path(Fake({"full", "late@25", "overlap@0.15"}), cases)
    assert got == {**got, "method": "rcllm", "rcllm_select": "overlap", "item_ratio": 0.15,
                   "history_ratio": 0.15, "within": True}
    got = choose_fast_path(Fake({"full", "late@20", "overlap@0.3"}), cases)
    assert (got["method"], got["item_ratio"]) == ("rcllm", 0.3)
    closest = choose_fast_path(Fake({"full"}), cases)
    assert closest["within"] is False and closest["validation"]["ndcg10"]["full"] == 1.0
    assert closest["validation"]["users"] == closest["validation"]["requests"] == 3


def test_choose_fast_path_asks_for_the_top5_agreement_and_the_interval_too():
    """A path level with full on NDCG@10 is not named when its top-5 differs from full's, nor
    when one user's requests lose so much that the interval's lower end falls below -0.05."""
    from types import SimpleNamespace as NS

    from rcllm.finetune.choice import choose_fast_path

    full = np.array([9.0, 8, 7, 6, 5, 0, 0, 0, 0, 0])       # target at index 0
    shuffled = np.array([9.0, 0, 0, 0, 0, 8, 7, 6, 5, 0])   # same top-1, top-5 overlap 0.2
    worse = np.array([0.0, 9, 8, 7, 6, 5, 4, 3, 2, 1])      # target last

    class Fake:
        tail, depths, ratios = 1, (20,), ()
        model = NS(arch=NS(num_layers=30))

        def __init__(self, fast):
            self.fast = fast

        def score_case(self, case, other, only):
            return {"full": full, "fast": self.fast(case), "late@20": full}

    cases = [NS(candidates=tuple("abcdefghij"), target="a", user_id=u, k=k)
             for u in "uvwxyz" for k in range(4)]
    assert choose_fast_path(Fake(lambda c: full), cases)["method"] == "naive"
    got = choose_fast_path(Fake(lambda c: shuffled), cases)
    assert got["method"] == "late" and got["validation"]["top5"]["naive"] == 0.2
    # one user in six loses every request: within a loose tolerance, but not the interval's
    one_user = choose_fast_path(Fake(lambda c: worse if c.user_id == "u" else full), cases,
                                tolerance=0.2)
    assert one_user["method"] == "late" and one_user["validation"]["delta_low"]["naive"] < -0.05
    assert choose_fast_path(Fake(lambda c: worse if c.user_id == "u" else full), cases,
                            tolerance=0.2, floor=-1.0)["method"] == "naive"
