"""Fixtures for the fine-tuning tests: a tiny config and a dataset with a learnable signal."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rcllm.config import ModelConfig, PromptConfig
from rcllm.eval.datasets import load_dataset
from rcllm.finetune.config import FinetuneConfig, LoraConfig, TrainConfig


@pytest.fixture
def fav_dataset():
    """Synthetic users whose last item is always the same one: a ranker can learn to pick it."""
    ds = load_dataset("", "synthetic", num_users=30, num_items=40, seed=0)
    fav = sorted(ds.items)[0]
    for hist in ds.users.values():
        hist[:] = [e for e in hist if e.item_id != fav]
        hist.append(dataclasses.replace(hist[-1], item_id=fav, timestamp=hist[-1].timestamp + 1))
    return ds


@pytest.fixture
def tiny_ft_config(tiny_model_dir, tmp_path):
    def make(first_layer: int = 0, **train) -> FinetuneConfig:
        opts = dict(steps=100, lr=1e-2, candidates=2, warmup_steps=2, checkpoint_every=10,
                    targets="last", batch=1, val_users=0,
                    reuse_select="naive")   # the plain reuse path; overlap is tested by name
        opts.update(train)
        cfg = FinetuneConfig(
            model=ModelConfig(path=str(tiny_model_dir), threads=0, cache_dir=str(tmp_path / "c")),
            prompt=PromptConfig(history_window=2, max_review_tokens=8, max_item_tokens=16),
            lora=LoraConfig(rank=4, alpha=8, first_layer=first_layer), train=TrainConfig(**opts))
        cfg.validate()
        return cfg
    return make


@pytest.fixture
def tiny_pointwise(tiny_ft_config, fav_dataset):
    """(model, the engine's PointwisePrompt) of the tiny model over fav_dataset's items."""
    from rcllm.model.loading import load_model
    from rcllm.prompt.builder import PromptBuilder
    from rcllm.prompt.pointwise import PointwisePrompt

    cfg = tiny_ft_config()
    loaded = load_model(cfg.model)
    builder = PromptBuilder(loaded.tokenizer, fav_dataset.items, cfg.prompt,
                            loaded.model.arch.max_positions, "verbalizer")
    return loaded.model, PointwisePrompt(builder, loaded.model.arch.max_positions)


@pytest.fixture
def scores_and_grads():
    """(scores per path, LoRA gradients) of one training draw, the trainer's adapter installed
    (the gradients of its loss, then the scores of both paths without a graph)."""
    from rcllm.finetune.lora import LoraPatch

    def run(t, draw):
        patch = LoraPatch(t.model, t.lora, t._base)
        patch.install()
        try:
            loss, _ = t.loss_of(draw)
            loss.backward()
            grads = {k: p.grad.clone() for k, p in t.lora.factors.items()}
            t.opt.zero_grad()
            with torch.no_grad():
                ex = draw.example
                scores = t.scores(ex.user_id, ex.history, draw.candidates,
                                  ("full", "reuse")).scores
        finally:
            patch.restore()
        return scores, grads
    return run


@pytest.fixture
def same_scores_and_grads(scores_and_grads):
    """Checks that two trainers (the same factors) give each draw the same scores on both paths
    and the same LoRA gradients (`scores_and_grads`)."""
    def check(whole, kept, draws):
        for draw in draws:
            want, want_g = scores_and_grads(whole, draw)
            got, got_g = scores_and_grads(kept, draw)
            for path in ("full", "reuse"):
                torch.testing.assert_close(got[path], want[path], rtol=1e-5, atol=1e-5)
            for name in want_g:
                # the chunks' states come from a pass over other chunks: float rounding
                # differs, so the gradients agree to a share of their scale
                scale = float(want_g[name].abs().max())
                torch.testing.assert_close(got_g[name], want_g[name], rtol=1e-3,
                                           atol=1e-4 * scale + 1e-7)
    return check


@pytest.fixture
def told_apart_by_the_user():
    """(trainer, n) -> n draws of n users that show the same candidates in the same order,
    each with another target (the overfit check: they can only be told apart through the
    user); the trainer's stream then draws them (draw i is the i-th)."""
    return _told_apart


def _told_apart(trainer, n: int = 4):
    from rcllm.finetune.data import Draw

    chosen, users = {}, set()
    for ex in trainer.stream.examples:   # distinct users, distinct targets
        if ex.target not in chosen and ex.user_id not in users:
            chosen[ex.target] = ex
            users.add(ex.user_id)
    examples = list(chosen.values())[:n]
    cands = tuple(ex.target for ex in examples)
    draws = [Draw(ex, cands, k) for k, ex in enumerate(examples)]
    trainer.stream.draw = lambda i: draws[i]
    return draws
