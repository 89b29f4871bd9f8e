"""Whether a run learnt anything (`finetune.learnt`): the rule, the standard error it rests on,
and the choice skipped — with the manifest saying so — for an adapter that learnt nothing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from rcllm.eval.protocol import split_users
from rcllm.finetune.learnt import learnt_check


def test_the_rule_on_numbers():
    ln4 = math.log(4)
    row = {"score": -1.0, "score_se": 0.1, "cases": 30}
    # kept the start: nothing learnt, whatever its cross-entropy
    assert learnt_check({"step": 0, **row}, 4)["learnt"] is False
    # well below chance: 1.0 + 2.05 * 0.1 < ln 4 (t quantile over 30 prompts)
    ok = learnt_check({"step": 8, **row}, 4)
    assert ok["learnt"] is True and ok["ln_c"] == round(ln4, 4) and ok["ce"] == 1.0
    # below chance by less than t(0.975, 29) = 2.05 standard errors: within noise
    near = learnt_check({"step": 8, "score": -(ln4 - 0.15), "score_se": 0.1, "cases": 30}, 4)
    assert near["learnt"] is False and "within noise" in near["reason"]
    # worse than chance is no better
    assert learnt_check({"step": 8, "score": -2.0, "score_se": 0.01, "cases": 30},
                        4)["learnt"] is False
    # the same cross-entropy with a tighter interval is learnt ...
    tight = {"step": 8, "score": -(ln4 - 0.15), "score_se": 0.05}
    assert learnt_check({**tight, "cases": 30}, 4)["learnt"] is True
    # ... but not over 3 prompts, where the t quantile is 4.30
    assert learnt_check({**tight, "cases": 3}, 4)["learnt"] is False
    # no standard error recorded: only the step rule, and the reason says so
    old = learnt_check({"step": 8, "score": -1.3}, 4)
    assert old["learnt"] is True and "only the step-0 rule" in old["reason"]
    assert learnt_check({"step": None}, 4)["learnt"] is None
    assert learnt_check({"step": 3, "score": -1.0}, None)["learnt"] is None


def test_validation_reports_the_standard_error_of_its_cross_entropy():
    from types import SimpleNamespace as NS

    from rcllm.finetune.validate import validate

    gen = torch.Generator().manual_seed(0)
    cases = [NS(target_index=k % 3) for k in range(7)]
    got = {id(c): {"full": torch.randn(3, generator=gen), "reuse": torch.randn(3, generator=gen)}
           for c in cases}
    out = validate(lambda c: got[id(c)], cases)
    ce = torch.nn.functional.cross_entropy
    per = [np.mean([float(ce(s[None], torch.tensor([c.target_index])))
                    for s in got[id(c)].values()]) for c in cases]
    assert out["cases"] == 7 and out["score"] == pytest.approx(-np.mean(per))
    assert out["score_se"] == pytest.approx(np.std(per, ddof=1) / math.sqrt(7))


def _run(tiny_ft_config, ds, folder, **train):
    from rcllm.finetune.trainer import Trainer
    from rcllm.model.loading import load_model

    cfg = tiny_ft_config(**train)
    train_users, val_users, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    Trainer(load_model(cfg.model), ds, train_users, cfg, folder, "k", val_users).run(False)
    return cfg


@pytest.mark.parametrize("lr", [1e-30, 1e-2])
def test_the_choice_runs_only_for_an_adapter_that_learnt(tiny_ft_config, fav_dataset,
                                                         tmp_path, capsys, lr):
    """lr 1e-30: updates too small to move a score, so early stopping keeps step 0; lr 1e-2:
    the favourite item is learnt, far below chance."""
    from rcllm.finetune.choice import choose_for_adapter

    folder = tmp_path / "a"
    cfg = _run(tiny_ft_config, fav_dataset, folder, lr=lr, steps=12, val_users=6,
                          val_every=4, val_candidates=4, reuse_select="overlap",
                          choice_targets=1)
    choose_for_adapter(cfg, folder, fav_dataset)
    out = capsys.readouterr().out
    m = json.loads((folder / "adapter.json").read_text())
    if lr < 1e-20:
        assert m["learnt"] is False and m["best"]["step"] == 0
        assert "the adapter learnt nothing: the kept checkpoint is the untrained start" in out
        assert m["fast_path"] is None and m["trained_fast_path"]["rcllm_select"] == "overlap"
        assert "fast-path choice" not in out
    else:
        assert m["learnt"] is True and m["learnt_check"]["ce"] < 0.5 * math.log(4)
        assert "learnt: validation cross-entropy" in out and "fast-path choice (" in out
        assert m["fast_path"]["validation"]["targets_per_user"] == 1
    # the verdict is recorded once; the same command again says it again and changes nothing
    choose_for_adapter(cfg, folder, fav_dataset)
    assert json.loads((folder / "adapter.json").read_text()) == m
