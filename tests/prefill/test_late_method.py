"""The `late` method: item KV from the store below reuse.late_layer, every item token computed
against the user from it up. Exact at its ends (0: full; num_layers: naive reuse of the whole
chunk) and equal in between to the diagnostics' late-joint path."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.config import ModelConfig, PromptConfig, RcllmConfig, ReuseConfig
from rcllm.engine import Engine
from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.finetune.diagnose import Diagnoser
from rcllm.model.loading import load_model
from rcllm.prompt.builder import RankRequest


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    ds = load_dataset("", "synthetic", num_users=6, num_items=20, seed=0)
    loaded = load_model(ModelConfig(path=str(tiny_model_dir), threads=0))
    cfg = RcllmConfig(prompt=PromptConfig(history_window=2, max_review_tokens=8,
                                          max_item_tokens=12),
                      reuse=ReuseConfig(prefix_insert=False, user_prefix=False,
                                        user_side="exact"))
    eng = Engine(loaded, ds.items, cfg, scorer="pointwise")
    cases = build_cases(ds, history_window=2, num_negatives=4)[:2]
    eng.build_items({c for case in cases for c in case.candidates})
    return eng, cases


def _scores(eng, case, method, **over):
    req = RankRequest(case.user_id, case.history, tuple(case.candidates))
    res = eng.rank(req, method, **over)
    return np.array([res.scores[c] for c in case.candidates]), res


def test_late_is_exact_at_both_ends(engine):
    eng, cases = engine
    L = eng.model.arch.num_layers
    for case in cases:
        full, _ = _scores(eng, case, "full")
        late0, r0 = _scores(eng, case, "late", late_layer=0)
        np.testing.assert_allclose(late0, full, rtol=1e-4, atol=1e-4)
        assert r0.stats.reused_tokens["item"] == 0
        naive, _ = _scores(eng, case, "naive", item_tail=0)
        lateL, rL = _scores(eng, case, "late", late_layer=L)
        np.testing.assert_allclose(lateL, naive, rtol=1e-5, atol=1e-5)
        assert rL.stats.reused_tokens["item"] > 0


@pytest.mark.parametrize("tail", [0, 1])
def test_late_in_between_is_the_diagnostics_path(engine, tail):
    eng, cases = engine
    L = eng.model.arch.num_layers
    d = Diagnoser(eng.model, eng.pointwise, tail=tail, depths=(1, L - 1))
    for case in cases:
        got = d.score_case(case, cases[1 - cases.index(case)])
        for s in (1, L - 1):
            served, res = _scores(eng, case, "late", late_layer=s, item_tail=tail)
            full, _ = _scores(eng, case, "full")
            off_full = np.abs(served - full).max()
            assert off_full > 1e-4   # the store's KV below s was used
            if tail == 0:  # the user side exact in both
                np.testing.assert_allclose(served, got[f"late@{s}"], rtol=1e-4, atol=1e-5)
            assert res.stats.reused_tokens["item"] > 0


def test_late_layer_is_checked():
    with pytest.raises(RcllmError):
        ReuseConfig(method="late", late_layer=-1).validate()
    from rcllm.commands.common import parse_methods

    v = parse_methods("late@12,naive", 0.3, 0.3)
    assert [x.label for x in v] == ["full", "late@12", "naive"]
    assert v[1].overrides()["late_layer"] == 12
    with pytest.raises(RcllmError):
        parse_methods("late@x", 0.3, 0.3)
