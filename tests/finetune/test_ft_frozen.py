"""The frozen layers' cache is exact: a prompt scored again from the states entering the first
adapted layer gets the scores and the gradients of a whole pass."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rcllm.config import ReuseConfig
from rcllm.eval.protocol import split_users
from rcllm.finetune.config import LoraConfig
from rcllm.finetune.trainer import Trainer
from rcllm.model.loading import load_model
from rcllm.prefill.selection import SelectionPolicy, selection_policy
from rcllm.prefill.selective import prefill


def _trainer(cfg, ds, folder, first_layer: int, cache_gb: float):
    cfg = dataclasses.replace(
        cfg, lora=dataclasses.replace(cfg.lora, first_layer=first_layer),
        train=dataclasses.replace(cfg.train, frozen_cache_gb=cache_gb))
    train_users, val_users, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    return Trainer(load_model(cfg.model), ds, train_users, cfg, folder, "k", val_users)


def test_a_cached_prompt_scores_and_trains_as_a_whole_pass(tiny_ft_config, fav_dataset,
                                                           tmp_path, scores_and_grads):
    cfg = tiny_ft_config(candidates=3, reuse_tail=1)
    whole = _trainer(cfg, fav_dataset, tmp_path / "w", first_layer=2, cache_gb=0)
    cached = _trainer(cfg, fav_dataset, tmp_path / "c", first_layer=2, cache_gb=1)
    assert whole.scorer.cache is None and cached.scorer.cache is not None
    with torch.no_grad():  # the same non-zero adapter in both
        for name, p in whole.lora.factors.items():
            p.copy_(torch.randn_like(p) * 0.3)
            cached.lora.factors[name].copy_(p)
    draw = whole.stream.draw(0)
    want, want_g = scores_and_grads(whole, draw)
    for _ in range(2):  # the first scoring records the frozen states, the next ones start there
        got, got_g = scores_and_grads(cached, draw)
        for path in ("full", "reuse"):
            torch.testing.assert_close(got[path], want[path], rtol=1e-5, atol=1e-5)
        for name in want_g:
            torch.testing.assert_close(got_g[name], want_g[name], rtol=1e-4, atol=1e-6)
    assert cached.scorer.cache.hits >= 3 and len(cached.scorer.cache.held) == 1
    flipped = dataclasses.replace(draw, candidates=draw.candidates[::-1],
                                  target_index=len(draw.candidates) - 1 - draw.target_index)
    got, _ = scores_and_grads(cached, flipped)  # another order: the same entry, same scores
    for path in ("full", "reuse"):
        torch.testing.assert_close(got[path], want[path].flip(0), rtol=1e-5, atol=1e-5)
    assert len(cached.scorer.cache.held) == 1
    assert any(g.abs().max() > 0 for g in got_g.values())


def test_the_cache_holds_no_more_than_its_limit(tiny_ft_config, fav_dataset, tmp_path):
    t = _trainer(tiny_ft_config(candidates=3), fav_dataset, tmp_path / "l", 2, cache_gb=1e-9)
    ex = t.stream.draw(0).example
    with torch.no_grad():
        t.scores(ex.user_id, ex.history, t.stream.draw(0).candidates, ("full", "reuse"))
    assert t.scorer.cache.held == {} and t.scorer.cache.used == 0


def test_no_cache_below_the_first_adapted_layer(tiny_ft_config, fav_dataset, tmp_path):
    t = _trainer(tiny_ft_config(), fav_dataset, tmp_path / "n", first_layer=0, cache_gb=1)
    assert t.scorer.cache is None


def test_prefill_started_at_a_layer_equals_the_whole_prefill(tiny_ft_config, fav_dataset,
                                                             tmp_path):
    t = _trainer(tiny_ft_config(), fav_dataset, tmp_path / "p", first_layer=2, cache_gb=0)
    ids = list(range(100, 140))
    naive = SelectionPolicy(ReuseConfig(method="naive"))
    whole = prefill(t.model, t.scorer._inputs(ids, [(20, 30), (30, 40)]), naive, capture=2)
    again = prefill(t.model, t.scorer._inputs(ids, [(20, 30), (30, 40)]), naive,
                    start=whole.frozen)
    torch.testing.assert_close(again.hidden_out, whole.hidden_out)
    assert whole.frozen.layer == 2 and len(whole.frozen.idx) == 40
    with pytest.raises(ValueError, match="without a probe"):
        prefill(t.model, t.scorer._inputs(ids, [(20, 40)]),
                selection_policy(ReuseConfig(method="cacheblend")), capture=2)
    with pytest.raises(ValueError, match="not within"):
        prefill(t.model, t.scorer._inputs(ids, [(20, 40)]), naive, capture=0)


def test_fixed_negatives_repeat_an_examples_prompt_every_epoch(tiny_ft_config, fav_dataset,
                                                               tmp_path):
    fixed = _trainer(tiny_ft_config(candidates=4), fav_dataset, tmp_path / "f", 0, 0).stream
    fresh = _trainer(tiny_ft_config(candidates=4, negatives="fresh"), fav_dataset,
                     tmp_path / "g", 0, 0).stream
    n = len(fixed)

    def seen(stream):
        sets, orders = {}, {}
        for i in range(2 * n):
            d = stream.draw(i)
            sets.setdefault(d.example, set()).add(frozenset(d.candidates))
            orders.setdefault(d.example, set()).add(d.candidates)
        return sets, orders

    sets, orders = seen(fixed)
    assert len(sets) == n and all(len(c) == 1 for c in sets.values())
    assert any(len(o) > 1 for o in orders.values())   # the label order is still fresh
    sets, _ = seen(fresh)
    assert any(len(c) > 1 for c in sets.values())
    assert LoraConfig().first_layer > 0  # the default recipe caches
