"""The reuse path's isolated chunk pass below a frozen layer is kept per item chunk: later
prompts that hold the same items read it, with the scores and gradients of a whole pass."""

from __future__ import annotations

import dataclasses

import torch

from rcllm.eval.protocol import split_users
from rcllm.finetune.trainer import Trainer
from rcllm.model.loading import load_model


def _trainer(cfg, ds, folder, cache_gb: float, item_cache: bool = True):
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, frozen_cache_gb=cache_gb, item_cache=item_cache))
    train_users, val_users, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    return Trainer(load_model(cfg.model), ds, train_users, cfg, folder, "k", val_users)


def _same_adapter(a, b):
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in a.lora.factors.items():
            p.copy_(torch.randn_like(p) * 0.3)
            b.lora.factors[name].copy_(p)


def _draws_sharing_items(t, n: int):
    """The first n draws; at least one item of a later draw is in an earlier one."""
    draws = [t.stream.draw(i) for i in range(n)]
    seen: set = set()
    shared = False
    for d in draws:
        shared |= bool(seen & set(d.candidates))
        seen |= set(d.candidates)
    assert shared, "the test needs draws that share items"
    return draws


def test_item_states_are_read_by_later_prompts_with_a_whole_passs_scores_and_grads(
        tiny_ft_config, fav_dataset, tmp_path, same_scores_and_grads):
    cfg = tiny_ft_config(first_layer=2, candidates=3, reuse_tail=1)
    whole = _trainer(cfg, fav_dataset, tmp_path / "w", cache_gb=0)
    kept = _trainer(cfg, fav_dataset, tmp_path / "k", cache_gb=1)
    assert whole.scorer.items is None                 # no frozen layer kept: the whole pass
    assert kept.scorer.items is not None and kept.scorer.items.layer == 2
    _same_adapter(whole, kept)
    draws = _draws_sharing_items(kept, 6)
    same_scores_and_grads(whole, kept, draws)
    items = kept.scorer.items
    assert items.hits > 0 and items.misses == len(items.held) > 0
    assert items.ctx is not None
    # each chunk kept once, below the first trained layer only
    st = next(iter(items.held.values()))
    assert len(st.k) == len(st.v) == 2 and st.h.shape[0] == st.k[0].shape[1]
    assert kept.scorer.cache.used == kept.scorer.cache.budget.used > 0


def test_the_late_paths_item_states_are_kept_below_the_late_layer(
        tiny_ft_config, fav_dataset, tmp_path, same_scores_and_grads):
    cfg = tiny_ft_config(first_layer=2, candidates=3, reuse_select="late", late_layer=1)
    whole = _trainer(cfg, fav_dataset, tmp_path / "w", cache_gb=0)
    kept = _trainer(cfg, fav_dataset, tmp_path / "k", cache_gb=1)
    assert whole.scorer.items.budget is None          # computed per prompt, kept nowhere
    assert kept.scorer.items.layer == 1
    _same_adapter(whole, kept)
    same_scores_and_grads(whole, kept, _draws_sharing_items(kept, 6))
    assert kept.scorer.items.hits > 0 and whole.scorer.items.held == {}


def test_prompts_and_items_share_one_budget(tiny_ft_config, fav_dataset, tmp_path):
    cfg = tiny_ft_config(first_layer=2, candidates=3)
    t = _trainer(cfg, fav_dataset, tmp_path / "b", cache_gb=1)
    draw = t.stream.draw(0)
    with torch.no_grad():
        t.scores(draw.example.user_id, draw.example.history, draw.candidates, ("full", "reuse"))
    items, prompts = t.scorer.items, t.scorer.cache
    held = (sum(s.nbytes for s in items.held.values()) + items.ctx.nbytes
            + sum(m.nbytes for m, _ in prompts.held.values()))
    assert len(prompts.held) == 1 and held == prompts.budget.used
    # a budget that holds the first prompt's item states and nothing more keeps no prompt
    small = _trainer(cfg, fav_dataset, tmp_path / "s", cache_gb=(held - 1) / 2**30)
    with torch.no_grad():
        small.scores(draw.example.user_id, draw.example.history, draw.candidates,
                     ("full", "reuse"))
    assert small.scorer.cache.held == {} and small.scorer.cache.used <= held - 1


def test_without_item_states_each_prompt_keeps_its_own_chunk_pass(
        tiny_ft_config, fav_dataset, tmp_path, same_scores_and_grads):
    """train.item_cache=false: the chunk pass runs whole the first time a prompt is scored and
    from its own captured states the next time (the former behaviour, bench's `:whole`)."""
    cfg = tiny_ft_config(first_layer=2, candidates=3, reuse_tail=1)
    whole = _trainer(cfg, fav_dataset, tmp_path / "w", cache_gb=0)
    own = _trainer(cfg, fav_dataset, tmp_path / "o", cache_gb=1, item_cache=False)
    assert own.scorer.items is None and own.scorer.cache is not None
    _same_adapter(whole, own)
    draw = own.stream.draw(0)
    same_scores_and_grads(whole, own, [draw, draw])
    (main, chunk), = own.scorer.cache.held.values()
    assert main.layer == chunk.layer == 2 and own.scorer.cache.hits >= 2
