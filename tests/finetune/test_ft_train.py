"""The training loop on the tiny model: loss goes down, resume is exact, merge equals training."""

from __future__ import annotations

import pytest
import torch

from rcllm.eval.protocol import split_users
from rcllm.finetune.adapter import read_adapter
from rcllm.finetune.lora import Lora, LoraPatch
from rcllm.finetune.trainer import Trainer
from rcllm.model.loading import load_model


def _trainer(cfg, ds, folder):
    train_users = split_users(ds, cfg.train.fractions, cfg.train.split_seed)[0]
    return Trainer(load_model(cfg.model), ds, train_users, cfg, folder, "test-key")


@torch.no_grad()
def _probe(trainer, steps=range(16)) -> float:
    return sum(float(trainer.loss_at(s)[0]) for s in steps) / len(steps)


@pytest.mark.parametrize("objective", ["pointwise", "listwise"])
def test_loss_goes_down(tiny_ft_config, fav_dataset, tmp_path, objective):
    t = _trainer(tiny_ft_config(objective=objective), fav_dataset, tmp_path / "a")
    before = _probe(t)
    assert t.run(progress=False) == tmp_path / "a"
    patch = LoraPatch(t.model, t.lora)
    patch.install()
    after = _probe(t)
    patch.restore()
    assert after < 0.6 * before, (before, after)
    _, manifest = read_adapter(tmp_path / "a")
    curve = manifest["loss_curve"]
    assert curve[-1][1] < curve[0][1]
    assert not (tmp_path / "a" / "checkpoint").exists()  # removed once the adapter is written


def test_resume_equals_uninterrupted(tiny_ft_config, fav_dataset, tmp_path):
    cfg = tiny_ft_config(steps=12, checkpoint_every=4)
    _trainer(cfg, fav_dataset, tmp_path / "straight").run(progress=False)
    first = _trainer(cfg, fav_dataset, tmp_path / "resumed")
    assert first.run(progress=False, stop_after=6) is None
    assert (tmp_path / "resumed" / "checkpoint" / "state.json").exists()
    second = _trainer(cfg, fav_dataset, tmp_path / "resumed")
    second.run(progress=False)
    assert second.state.step == 12 and len(second.state.losses) == 12
    a, _ = read_adapter(tmp_path / "straight")
    b, _ = read_adapter(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_merged_model_equals_trained_weights(tiny_ft_config, fav_dataset, tmp_path):
    """Loading with model.adapter merges exactly what training optimised."""
    import dataclasses

    cfg = tiny_ft_config(steps=8)
    t = _trainer(cfg, fav_dataset, tmp_path / "a")
    t.run(progress=False)
    patch = LoraPatch(t.model, t.lora)
    patch.install()
    ids = torch.tensor(t.builder.build(_request(t)).token_ids)
    with torch.no_grad():
        trained = t.model.forward(ids)["logits"]
    patch.restore()
    merged = load_model(dataclasses.replace(cfg.model, adapter=str(tmp_path / "a")))
    with torch.no_grad():
        got = merged.model.forward(ids)["logits"]
        base = t.model.forward(ids)["logits"]
    torch.testing.assert_close(got, trained, rtol=1e-4, atol=1e-4)
    assert (got - base).abs().max() > 1e-3  # the adapter changed something


def _assert_gradient_reaches_every_factor(t):
    patch = LoraPatch(t.model, t.lora)
    patch.install()
    try:
        loss = t.loss_at(0)[0]
        loss.backward()
    finally:
        patch.restore()
    assert all(f.grad is not None for f in t.lora.factors.values())


def _request(trainer):
    from rcllm.prompt.builder import RankRequest

    draw = trainer.stream.draw(0)
    return RankRequest(draw.example.user_id, draw.example.history, draw.candidates)


def test_pointwise_scores_equal_plain_forwards(tiny_ft_config, fav_dataset, tmp_path):
    """The packed training pass scores each candidate as one forward over its whole prompt
    (user side + head + title + tail) would — the prompt the engine's pointwise scorer reads."""
    t = _trainer(tiny_ft_config(candidates=3), fav_dataset, tmp_path / "p")
    draw = t.stream.draw(0)
    pw, ex = t.pointwise, draw.example
    with torch.no_grad():
        got = t.pointwise_scores(draw)
        want = []
        for c in draw.candidates:
            ids = torch.tensor(pw.user_side(ex.user_id, ex.history).ids + pw.candidate_ids(c))
            hidden = t.model.forward(ids, return_hidden=True)["hidden"]
            yes, no = (hidden @ t.model.lm_head[[pw.yes_id, pw.no_id]].T).tolist()
            want.append(yes - no)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-4, atol=1e-4)
    _assert_gradient_reaches_every_factor(t)


@pytest.mark.parametrize("tail", [0, 2])
def test_reuse_aware_scores_equal_the_engine_reusing_stored_item_kv(tiny_ft_config, fav_dataset,
                                                                   tmp_path, tail):
    """train.reuse trains on what serving computes: item chunks from the chunk store (built
    after the instruction and the block head), everything else computed over them (naive);
    with train.reuse_tail = k the last k tokens of each item chunk are computed in the prompt,
    as reuse.item_tail = k does when serving."""
    from rcllm.config import RcllmConfig, ReuseConfig
    from rcllm.engine import Engine

    t = _trainer(tiny_ft_config(candidates=3, reuse=True, reuse_tail=tail), fav_dataset,
                 tmp_path / "r")
    draw = t.stream.draw(0)
    eng = Engine(t.loaded, fav_dataset.items,
                 RcllmConfig(prompt=t.cfg.prompt,
                             reuse=ReuseConfig(prefix_insert=False, item_tail=tail)),
                 scorer="pointwise")
    eng.build_items(draw.candidates)
    req = _request(t)
    served = eng.rank(req, "naive", user_prefix=False)
    item_tokens = served.stats["tokens_by_kind"]["item"]
    assert served.stats["reused_tokens"]["item"] == item_tokens - tail * len(draw.candidates)
    with torch.no_grad():
        got = t.pointwise_scores(draw)
        plain = Trainer(t.loaded, fav_dataset, t.train_users,
                        tiny_ft_config(candidates=3), t.folder, t.key).pointwise_scores(draw)
    want = torch.tensor([served.scores[c] for c in draw.candidates])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - plain).abs().max() > 1e-4  # the chunks really saw less than in full
    _assert_gradient_reaches_every_factor(t)


def test_warm_start_copies_a_matching_adapter_and_refuses_another(tiny_ft_config, fav_dataset,
                                                                  tmp_path):
    """train.init starts from a finished adapter's factors (the key names it by checksum), and
    refuses one trained on another user split (it could have seen this run's held-out users)."""
    from rcllm.errors import RcllmError
    from rcllm.finetune.trainer import run_key

    _trainer(tiny_ft_config(steps=4), fav_dataset, tmp_path / "std").run(progress=False)
    factors, manifest = read_adapter(tmp_path / "std")
    cfg = tiny_ft_config(steps=4, reuse=True, init=str(tmp_path / "std"))
    t = _trainer(cfg, fav_dataset, tmp_path / "warm")
    for k, v in factors.items():
        torch.testing.assert_close(t.lora.factors[k].detach(), v)
    assert cfg.key_fields()["train"]["init"] == manifest["sha256"]
    assert run_key("m", "d", cfg) != run_key("m", "d", tiny_ft_config(steps=4, reuse=True))
    t.run(progress=False)
    assert read_adapter(tmp_path / "warm")[1]["train"]["init_sha256"] == manifest["sha256"]
    other = tiny_ft_config(steps=4, init=str(tmp_path / "std"), split_seed=1)
    with pytest.raises(RcllmError, match="split"):
        _trainer(other, fav_dataset, tmp_path / "other")


def test_distill_teacher_is_the_init_adapters_full_path_and_the_kl_goes_down(
        tiny_ft_config, fav_dataset, tmp_path):
    """train.distill: the teacher is the init adapter's full path (frozen), the student's reuse
    path is pulled towards it, and a run without the option keeps its old key."""
    from rcllm.errors import RcllmError
    from rcllm.finetune.trainer import run_key

    _trainer(tiny_ft_config(steps=100, candidates=3), fav_dataset, tmp_path / "std").run(
        progress=False)
    init = str(tmp_path / "std")
    cfg = tiny_ft_config(steps=40, candidates=3, reuse=True, init=init, distill=1.0)
    t = _trainer(cfg, fav_dataset, tmp_path / "d")
    teacher = t.teacher_scores(5)
    plain = _trainer(tiny_ft_config(steps=30, candidates=3), fav_dataset, tmp_path / "p")
    std = LoraPatch(plain.model, Lora(plain.cfg.lora, read_adapter(init)[0]))
    std.install()
    with torch.no_grad():
        want = plain.pointwise_scores(plain.stream.draw(5))
    std.restore()
    torch.testing.assert_close(teacher, want, rtol=1e-4, atol=1e-4)

    def probe_kl():
        patch = LoraPatch(t.model, t.lora, t._base)
        kls = []
        for s in range(8):
            tch = t.teacher_scores(s)
            patch.install()
            with torch.no_grad():
                kls.append(float(t.loss_at(s, tch)[2]))
        patch.restore()
        return sum(kls) / len(kls)

    # The tiny model's reuse path is nearly its full path (KL ~1e-6): start the student from
    # the base weights instead, so that there is a distance to the teacher to close.
    with torch.no_grad():
        for name, f in t.lora.factors.items():
            if name.endswith("lora_B"):
                f.zero_()
    before = probe_kl()
    assert before > 1e-3
    t.run(progress=False)
    after = probe_kl()
    assert after < 0.5 * before
    _, manifest = read_adapter(tmp_path / "d")
    assert all(len(row) == 4 for row in manifest["loss_curve"])  # KL recorded per window
    assert manifest["train"]["distill"] == 1.0
    undistilled = tiny_ft_config(steps=40, candidates=3, reuse=True, init=init)
    assert "distill" not in undistilled.key_fields()["train"]
    assert run_key("m", "d", cfg) != run_key("m", "d", undistilled)
    with pytest.raises(RcllmError, match="train.init"):
        tiny_ft_config(distill=0.5, reuse=True)
    with pytest.raises(RcllmError, match="0..1"):
        tiny_ft_config(distill=2.0, reuse=True, init=init)
