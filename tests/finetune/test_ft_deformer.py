"""The late path with LoRA below the join (issue 61's DeFormer anchor): the item chunk's
isolated pass is trained from the first adapted layer up to the join, what the trainer scores is
what the engine's late method serves on the merged weights, the gradients below the join are
the loss's derivatives, the item tokens' K/V above the join can be distilled from the full
path's, and a handful of prompts is overfit on the path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import pytest
import torch

from rcllm.eval.protocol import split_users
from rcllm.finetune.adapter import read_adapter
from rcllm.finetune.lora import Lora, LoraPatch
from rcllm.finetune.trainer import Trainer
from rcllm.model.loading import load_model

LATE = 2    # the tiny model has 3 layers: the join at 2 leaves layers 0 and 1 below it


def _trainer(cfg, ds, folder, cache_gb: float | None = None):
    if cache_gb is not None:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train,
                                                                 frozen_cache_gb=cache_gb))
    train_users, val_users, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    return Trainer(load_model(cfg.model), ds, train_users, cfg, folder, "k", val_users)


def _random_factors(*trainers, seed: int = 0):
    """The same random factors (B != 0, so every factor has a gradient) in each trainer."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in trainers[0].lora.factors.items():
            p.copy_(torch.randn_like(p) * 0.3)
            for other in trainers[1:]:
                other.lora.factors[name].copy_(p)


def _below(name: str) -> bool:
    """A factor of a layer below the join ("layers.<i>." in its name)."""
    return any(f"layers.{i}." in name for i in range(LATE))


@pytest.mark.parametrize("first_layer, distill", [(0, 0.0), (1, 1.0)])
def test_late_path_with_lora_below_the_join_equals_the_engines_late_method(
        tiny_ft_config, fav_dataset, tmp_path, first_layer, distill):
    """Trained with LoRA below s, the trainer's reuse path — its first scoring and its cached
    one (first_layer 1: the prompt pass from layer 1, the chunk pass from its item states) —
    gives the engine's late@s on the merged adapter, whose chunk KV and late states are built
    with the adapted lower layers."""
    from rcllm.config import RcllmConfig, ReuseConfig
    from rcllm.engine import Engine
    from rcllm.prompt.builder import RankRequest

    cfg = tiny_ft_config(first_layer=first_layer, candidates=3, steps=3, lr=5e-2,
                         reuse_select="late", late_layer=LATE, late_distill=distill)
    t = _trainer(cfg, fav_dataset, tmp_path / "d")
    assert (t.scorer.cache is None) == (first_layer == 0)
    t.run(progress=False)
    factors = read_adapter(tmp_path / "d")[0]
    assert any(_below(n) and n.endswith("lora_B") and float(f.abs().max()) > 0
               for n, f in factors.items())            # the layers below s were trained
    tuned = load_model(dataclasses.replace(cfg.model, adapter=str(tmp_path / "d")))
    draw = t.stream.draw(0)
    ex = draw.example
    eng = Engine(tuned, fav_dataset.items, RcllmConfig(prompt=cfg.prompt, reuse=ReuseConfig(
        prefix_insert=False, late_layer=LATE, user_side="exact")), scorer="pointwise")
    eng.build_items(draw.candidates)
    req = RankRequest(ex.user_id, ex.history, draw.candidates)
    served = eng.rank(req, "late", user_prefix=False)
    full = eng.rank(req, "full", user_prefix=False)
    want = torch.tensor([served.scores[c] for c in draw.candidates])
    patch = LoraPatch(t.model, Lora(cfg.lora, factors), t._base)
    patch.install()
    with torch.no_grad():
        got = [t.scorer.score(ex.user_id, ex.history, draw.candidates, ("full", "reuse"))
               for _ in range(2)]           # the second from the frozen layers' cache if any
    patch.restore()
    if first_layer:
        assert t.scorer.cache.hits >= 1 and t.scorer.items.layer == first_layer
    for joint in got:
        torch.testing.assert_close(joint.scores["reuse"], want, rtol=1e-4, atol=1e-4)
        assert (joint.late_kv is not None) == bool(distill)
    assert max(abs(served.scores[c] - full.scores[c]) for c in draw.candidates) > 1e-4


def test_gradients_below_the_join_are_the_losss_derivatives(tiny_ft_config, fav_dataset,
                                                           tmp_path, scores_and_grads):
    """Every layer adapted, the join at 2: the factors of layers 0 and 1 get gradients through
    the item chunk's isolated pass (its KV below s and its states entering s), and along a
    random direction of those factors the gradient matches a central finite difference of
    the loss (a detached chunk pass would leave part of it out)."""
    cfg = tiny_ft_config(first_layer=0, candidates=3, reuse_select="late", late_layer=LATE,
                         late_distill=0.5)
    t = _trainer(cfg, fav_dataset, tmp_path / "g")
    _random_factors(t)
    draw = t.stream.draw(0)
    _, grads = scores_and_grads(t, draw)
    below = [n for n in grads if _below(n)]
    assert below and all(float(grads[n].abs().max()) > 0 for n in below)
    gen = torch.Generator().manual_seed(1)
    step = {n: torch.randn(grads[n].shape, generator=gen) for n in below}
    norm = math.sqrt(sum(float(d.pow(2).sum()) for d in step.values()))
    want = sum(float((grads[n] * step[n]).sum()) for n in below) / norm
    eps, losses = 1e-2, []
    for sign in (1, -1):
        with torch.no_grad():
            for n in below:
                t.lora.factors[n].add_(sign * eps * step[n] / norm)
        patch = LoraPatch(t.model, t.lora, t._base)
        patch.install()
        with torch.no_grad():
            losses.append(float(t.loss_of(draw)[0]))
        patch.restore()
        with torch.no_grad():
            for n in below:
                t.lora.factors[n].sub_(sign * eps * step[n] / norm)
    got = (losses[0] - losses[1]) / (2 * eps)
    assert abs(want) > 1e-3 and got == pytest.approx(want, rel=2e-2, abs=1e-4)


def test_the_prompt_and_item_caches_stay_exact_with_lora_below_the_join(
        tiny_ft_config, fav_dataset, tmp_path, same_scores_and_grads):
    """LoRA from layer 1, the join at 2: the prompt pass cached at layer 1 (joined at 2 every
    time) and the chunks' states kept below layer 1 give the scores and gradients of the
    uncached pass."""
    cfg = tiny_ft_config(first_layer=1, candidates=3, reuse_select="late", late_layer=LATE)
    whole = _trainer(cfg, fav_dataset, tmp_path / "w", cache_gb=0)
    kept = _trainer(cfg, fav_dataset, tmp_path / "k", cache_gb=1)
    assert whole.scorer.cache is None and kept.scorer.items.layer == 1
    _random_factors(whole, kept)
    draws = [kept.stream.draw(i) for i in range(4)]
    same_scores_and_grads(whole, kept, draws + draws[:1])   # the last from the prompt cache
    assert kept.scorer.cache.hits >= 1 and kept.scorer.items.hits > 0


def test_late_distill_is_positive_on_the_late_path_and_falls_when_trained(
        tiny_ft_config, fav_dataset, tmp_path):
    """The item tokens' K/V mismatch above the join is positive before training (the item
    saw the user only from s up) and falls when it weighs on the loss (here it fell from
    0.027 to 0.0006 in 20 steps, the cross-entropies barely moving)."""
    cfg = tiny_ft_config(first_layer=0, candidates=3, reuse_select="late", late_layer=LATE,
                         late_distill=100.0, lr=1e-3, match=0.0)
    t = _trainer(cfg, fav_dataset, tmp_path / "m")
    rows = t.overfit(1, 20)
    first, last = rows[0]["late_kv"], rows[-1]["late_kv"]
    assert first > 1e-3 and last < 0.2 * first, [r["late_kv"] for r in rows]


def test_late_path_with_lora_below_the_join_overfits_a_handful_of_prompts(
        tiny_ft_config, fav_dataset, tmp_path, told_apart_by_the_user):
    """`rcllm finetune --overfit 4` on the new path: four prompts with the same candidates,
    each another target, told apart only through the user; both cross-entropies fall from
    ln 4 to a fraction of it (the join at 2 of 3 layers, every layer adapted)."""
    cfg = tiny_ft_config(first_layer=0, targets="all", lr=3e-3, reuse_select="late",
                         late_layer=LATE, late_distill=0.1)
    cfg = dataclasses.replace(cfg, prompt=dataclasses.replace(cfg.prompt, max_review_tokens=16))
    t = _trainer(cfg, fav_dataset, tmp_path / "o")
    rows = t.overfit(len(told_apart_by_the_user(t)), 400)
    assert rows[0]["ce_reuse"] > 0.9 * math.log(4)
    tail = rows[-20:]
    assert min(r["ce_full"] for r in tail) < 0.25 * math.log(4), tail
    assert min(r["ce_reuse"] for r in tail) < 0.25 * math.log(4), tail


def _key(cfg) -> str:
    return hashlib.sha256(json.dumps(cfg.key_fields(), sort_keys=True).encode()).hexdigest()[:16]


def test_keys_from_before_hold_and_late_distill_is_in_the_key():
    """The keys of configurations that existed before (computed with the code before the
    option) are unchanged; train.late_distill enters the key only when set."""
    from rcllm.errors import RcllmError
    from rcllm.finetune.config import FinetuneConfig, LoraConfig, TrainConfig

    def make(first_layer=20, **train):
        cfg = FinetuneConfig(lora=LoraConfig(first_layer=first_layer),
                             train=TrainConfig(**train))
        cfg.validate()
        return cfg

    assert _key(make(reuse_select="late", late_layer=20)) == "dc0c8c34dc9c27e8"
    assert _key(make(15, reuse_select="late", late_layer=15)) == "13ba5c106dec8fc1"
    assert _key(make()) == "d5381f2cb3ba0eaa"
    deformer = make(0, reuse_select="late", late_layer=15)
    distilled = make(0, reuse_select="late", late_layer=15, late_distill=1.0)
    assert "late_distill" not in deformer.key_fields()["train"]
    assert distilled.key_fields()["train"]["late_distill"] == 1.0
    assert _key(deformer) != _key(distilled)
    with pytest.raises(RcllmError, match="late_distill needs"):
        make(0, late_distill=1.0)                  # the overlap path: nothing to match
    with pytest.raises(RcllmError, match="late_layer=0"):
        make(0, reuse_select="late", late_layer=0)
