"""The training loop on the tiny model: loss goes down, a handful of prompts is overfit on the
joint path, resume is exact, merge equals training, training scores equal the engine's, the
best validation's weights are kept."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rcllm.eval.protocol import split_users
from rcllm.finetune.adapter import read_adapter
from rcllm.finetune.lora import Lora, LoraPatch
from rcllm.finetune.trainer import Trainer
from rcllm.model.loading import load_model


def _trainer(cfg, ds, folder):
    train_users, val_users, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    return Trainer(load_model(cfg.model), ds, train_users, cfg, folder, "test-key", val_users)


@torch.no_grad()
def _probe(trainer, steps=range(16)) -> float:
    return sum(float(trainer.loss_at(s)[0]) for s in steps) / len(steps)


@pytest.mark.parametrize("objective, path", [("pointwise", "joint"), ("listwise", "full")])
def test_loss_goes_down(tiny_ft_config, fav_dataset, tmp_path, objective, path):
    t = _trainer(tiny_ft_config(objective=objective, path=path), fav_dataset, tmp_path / "a")
    before = _probe(t)
    assert t.run(progress=False) == tmp_path / "a"
    patch = LoraPatch(t.model, t.lora)
    patch.install()
    after = _probe(t)
    patch.restore()
    assert after < 0.6 * before, (before, after)
    curve = json.loads((tmp_path / "a" / "curves.json").read_text())["train"]
    key = "ce_full"
    assert sum(r[key] for r in curve[-10:]) < sum(r[key] for r in curve[:10])
    assert not (tmp_path / "a" / "checkpoint").exists()  # removed once the adapter is written


def test_joint_path_overfits_a_handful_of_prompts(tiny_ft_config, fav_dataset, tmp_path,
                                                  told_apart_by_the_user):
    """Before blaming the model: four prompts of four users that show the same candidates in
    the same order, each with another target, can only be told apart through the user; the
    joint path drives both cross-entropies from ln 4 to a fraction of it. (The tiny model's
    random weights make the descent noisy and its length depends on the CPU's arithmetic: on
    an AMD EPYC it first reached the plateau (~0.045) after ~200 steps, bouncing up to ln 2.9
    before; 400 steps leave a margin. The real model's run is in docs/finetune.md.)"""
    import math

    cfg = tiny_ft_config(targets="all", lr=3e-3)
    cfg = dataclasses.replace(cfg, prompt=dataclasses.replace(cfg.prompt, max_review_tokens=16))
    t = _trainer(cfg, fav_dataset, tmp_path / "o")
    rows = t.overfit(len(told_apart_by_the_user(t)), 400)
    assert rows[0]["ce_full"] > 0.9 * math.log(4) and rows[0]["ce_reuse"] > 0.9 * math.log(4)
    late = rows[-20:]
    assert min(r["ce_full"] for r in late) < 0.25 * math.log(4), late
    assert min(r["ce_reuse"] for r in late) < 0.25 * math.log(4), late


def test_resume_equals_uninterrupted(tiny_ft_config, fav_dataset, tmp_path):
    """With accumulation and validations (the kept best factors included)."""
    cfg = tiny_ft_config(steps=12, checkpoint_every=4, batch=2, val_users=3, val_every=3,
                         val_candidates=4, patience=0)
    _trainer(cfg, fav_dataset, tmp_path / "straight").run(progress=False)
    first = _trainer(cfg, fav_dataset, tmp_path / "resumed")
    assert first.run(progress=False, stop_after=6) is None
    assert (tmp_path / "resumed" / "checkpoint" / "state.json").exists()
    second = _trainer(cfg, fav_dataset, tmp_path / "resumed")
    second.run(progress=False)
    assert second.state.step == 12 and len(second.state.train) == 12
    a, _ = read_adapter(tmp_path / "straight")
    b, _ = read_adapter(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    curves = [json.loads((tmp_path / f / "curves.json").read_text())
              for f in ("straight", "resumed")]
    assert curves[0]["best_step"] == curves[1]["best_step"]
    assert [r["step"] for r in curves[1]["validation"]] == [0, 3, 6, 9, 12]


def test_best_validation_is_kept_and_patience_stops(tiny_ft_config, fav_dataset, tmp_path):
    """The adapter holds the factors of the best validation NDCG@10 (validation users only),
    and a run stops after `patience` validations without a better one."""
    cfg = tiny_ft_config(steps=40, lr=0.3, val_users=4, val_every=2, val_candidates=4,
                         patience=2)  # a learning rate that wrecks the ranker
    t = _trainer(cfg, fav_dataset, tmp_path / "b")
    val_users = set(split_users(fav_dataset, cfg.train.fractions, cfg.train.split_seed)[1])
    assert t.val_cases and {c.user_id for c in t.val_cases} <= val_users
    t.run(progress=False)
    vals = t.state.val
    best = max(vals, key=lambda r: r["score"])
    assert t.state.best_step == best["step"]
    if t.state.stopped_early:
        assert len(vals) - 1 - vals.index(best) == 2 and t.state.step < 40
    factors, manifest = read_adapter(tmp_path / "b")
    assert manifest["best"]["step"] == best["step"]
    if best["step"] == 0:
        assert all(float(v.abs().max()) == 0 for k, v in factors.items() if k.endswith("B"))


def test_merged_model_equals_trained_weights(tiny_ft_config, fav_dataset, tmp_path):
    """Loading with model.adapter merges exactly what training optimised."""
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
    t = _trainer(tiny_ft_config(candidates=3, path="full"), fav_dataset, tmp_path / "p")
    draw = t.stream.draw(0)
    pw, ex = t.scorer.pw, draw.example
    with torch.no_grad():
        got = t.scores(ex.user_id, ex.history, draw.candidates, ("full",)).scores["full"]
        want = []
        for c in draw.candidates:
            ids = torch.tensor(pw.user_side(ex.user_id, ex.history).ids + pw.candidate_ids(c))
            hidden = t.model.forward(ids, return_hidden=True)["hidden"]
            yes, no = (hidden @ t.model.lm_head[[pw.yes_id, pw.no_id]].T).tolist()
            want.append(yes - no)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-4, atol=1e-4)
    _assert_gradient_reaches_every_factor(t)


@pytest.mark.parametrize("tail, ending", [(0, "answer"), (2, "answer"), (1, "mark")])
def test_training_scores_equal_the_engines_for_each_path(tiny_ft_config, fav_dataset, tmp_path,
                                                         tail, ending):
    """Each path trains on what serving computes, with an adapter installed: the full path on
    the engine's full scores, the reuse path on its naive scores with the item chunks taken
    from the store (built after the instruction and the block head) and the last `tail` tokens
    of each computed in the prompt (reuse.item_tail); the joint pass (one user side, both sets
    of blocks) on both at once; for each block ending (`prompt.block_ending`)."""
    from rcllm.config import RcllmConfig, ReuseConfig
    from rcllm.engine import Engine
    from rcllm.finetune.trainer import Trainer as T

    cfg = tiny_ft_config(candidates=3, reuse_tail=tail, steps=3, lr=5e-2)
    cfg = dataclasses.replace(cfg, prompt=dataclasses.replace(cfg.prompt, block_ending=ending))
    t = _trainer(cfg, fav_dataset, tmp_path / "r")
    t.run(progress=False)   # a non-zero adapter: the pin must hold for trained weights
    tuned = load_model(dataclasses.replace(cfg.model, adapter=str(tmp_path / "r")))
    draw = t.stream.draw(0)
    eng = Engine(tuned, fav_dataset.items,
                 RcllmConfig(prompt=cfg.prompt,
                             reuse=ReuseConfig(prefix_insert=False, item_tail=tail)),
                 scorer="pointwise")
    eng.build_items(draw.candidates)
    req = _request(t)
    naive = eng.rank(req, "naive", user_prefix=False)
    full = eng.rank(req, "full", user_prefix=False)
    item_tokens = naive.stats["tokens_by_kind"]["item"]
    assert naive.stats["reused_tokens"]["item"] == item_tokens - tail * len(draw.candidates)
    ex = draw.example
    patch = LoraPatch(t.model, Lora(cfg.lora, read_adapter(tmp_path / "r")[0]), t._base)
    patch.install()
    with torch.no_grad():
        joint = t.scores(ex.user_id, ex.history, draw.candidates, ("full", "reuse")).scores
        alone = {p: t.scores(ex.user_id, ex.history, draw.candidates, (p,)).scores[p]
                 for p in ("full", "reuse")}
    patch.restore()
    for path, served in (("full", full), ("reuse", naive)):
        want = torch.tensor([served.scores[c] for c in draw.candidates])
        torch.testing.assert_close(joint[path], want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(alone[path], want, rtol=1e-4, atol=1e-4)
    assert (joint["full"] - joint["reuse"]).abs().max() > 1e-4  # the chunks really saw less
    _assert_gradient_reaches_every_factor(T(t.loaded, fav_dataset, t.train_users, cfg,
                                            t.folder, t.key))


def test_warm_start_copies_a_matching_adapter_and_refuses_another(tiny_ft_config, fav_dataset,
                                                                  tmp_path):
    """train.init starts from a finished adapter's factors (the key names it by checksum), and
    refuses one trained on another user split (it could have seen this run's held-out users)."""
    from rcllm.errors import RcllmError
    from rcllm.finetune.trainer import run_key

    _trainer(tiny_ft_config(steps=4), fav_dataset, tmp_path / "std").run(progress=False)
    factors, manifest = read_adapter(tmp_path / "std")
    cfg = tiny_ft_config(steps=4, path="reuse", init=str(tmp_path / "std"))
    t = _trainer(cfg, fav_dataset, tmp_path / "warm")
    for k, v in factors.items():
        torch.testing.assert_close(t.lora.factors[k].detach(), v)
    assert cfg.key_fields()["train"]["init"] == manifest["sha256"]
    assert run_key("m", "d", cfg) != run_key("m", "d", tiny_ft_config(steps=4, path="reuse"))
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

    _trainer(tiny_ft_config(steps=100, candidates=3, path="full"), fav_dataset,
             tmp_path / "std").run(
        progress=False)
    init = str(tmp_path / "std")
    cfg = tiny_ft_config(steps=40, candidates=3, path="reuse", init=init, distill=1.0)
    t = _trainer(cfg, fav_dataset, tmp_path / "d")
    teacher = t.teacher_scores(5)
    plain = _trainer(tiny_ft_config(steps=30, candidates=3, path="full"), fav_dataset,
                     tmp_path / "p")
    std = LoraPatch(plain.model, Lora(plain.cfg.lora, read_adapter(init)[0]))
    std.install()
    with torch.no_grad():
        d = plain.stream.draw(5)
        want = plain.scores(d.example.user_id, d.example.history, d.candidates,
                            ("full",)).scores["full"]
    std.restore()
    torch.testing.assert_close(teacher, want, rtol=1e-4, atol=1e-4)

    def probe_kl():
        patch = LoraPatch(t.model, t.lora, t._base)
        kls = []
        for s in range(8):
            tch = t.teacher_scores(s)
            patch.install()
            with torch.no_grad():
                kls.append(t.loss_at(s, tch)[1]["kl"])
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
    curve = json.loads((tmp_path / "d" / "curves.json").read_text())["train"]
    assert all("kl" in row for row in curve)  # KL recorded per window
    assert manifest["train"]["distill"] == 1.0
    undistilled = tiny_ft_config(steps=40, candidates=3, path="reuse", init=init)
    assert "distill" not in undistilled.key_fields()["train"]
    assert run_key("m", "d", cfg) != run_key("m", "d", undistilled)
    with pytest.raises(RcllmError, match="train.init"):
        tiny_ft_config(distill=0.5, path="reuse")
    with pytest.raises(RcllmError, match="0..1"):
        tiny_ft_config(distill=2.0, path="reuse", init=init)


def _engine_scores(tuned, cfg, ds, trainer, reuse, method, **kw):
    """The engine's answers for the trainer's first draw: `method` with `reuse` (the user side
    exact), naive and full."""
    from rcllm.config import RcllmConfig
    from rcllm.engine import Engine

    eng = Engine(tuned, ds.items, RcllmConfig(prompt=cfg.prompt, reuse=reuse),
                 scorer="pointwise")
    eng.build_items(trainer.stream.draw(0).candidates)
    req = _request(trainer)
    return (eng.rank(req, method, user_prefix=False, **kw),
            eng.rank(req, "naive", user_prefix=False), eng.rank(req, "full", user_prefix=False))


@pytest.mark.parametrize("tail, fill", [(0, "order"), (1, "ends")])
def test_overlap_reuse_path_equals_the_engines_rcllm_overlap(tiny_ft_config, fav_dataset,
                                                             tmp_path, tail, fill):
    """train.reuse_select=overlap trains on what the engine's rcllm method with
    rcllm_select=overlap serves at that ratio (user side exact): the trainer's reuse path, its
    joint pass, and the diagnostics' overlap@r all give the engine's scores — and they differ
    from naive reuse (the selection computes tokens) and from full."""
    from rcllm.config import ReuseConfig
    from rcllm.finetune.diagnose import Diagnoser

    cfg = tiny_ft_config(candidates=3, reuse_tail=tail, steps=3, lr=5e-2,
                         reuse_select="overlap", reuse_ratio=0.5, reuse_fill=fill)
    t = _trainer(cfg, fav_dataset, tmp_path / "o")
    assert t.fast_path() == {"method": "rcllm", "rcllm_select": "overlap", "item_ratio": 0.5,
                             "history_ratio": 0.5, "item_tail": tail, "user_side": "exact",
                             **({"overlap_fill": fill} if fill == "ends" else {})}
    t.run(progress=False)
    tuned = load_model(dataclasses.replace(cfg.model, adapter=str(tmp_path / "o")))
    draw = t.stream.draw(0)
    served, naive, full = _engine_scores(
        tuned, cfg, fav_dataset, t, ReuseConfig(prefix_insert=False, item_tail=tail,
                                                rcllm_select="overlap", overlap_fill=fill,
                                                user_side="exact"),
        "rcllm", item_ratio=0.5, history_ratio=0.5)
    want = torch.tensor([served.scores[c] for c in draw.candidates])
    ex = draw.example
    patch = LoraPatch(t.model, Lora(cfg.lora, read_adapter(tmp_path / "o")[0]), t._base)
    patch.install()
    with torch.no_grad():
        joint = t.scores(ex.user_id, ex.history, draw.candidates, ("full", "reuse")).scores
        alone = t.scores(ex.user_id, ex.history, draw.candidates, ("reuse",)).scores["reuse"]
    patch.restore()
    torch.testing.assert_close(joint["reuse"], want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(alone, want, rtol=1e-4, atol=1e-4)
    case = type("Case", (), {"user_id": ex.user_id, "history": ex.history,
                             "candidates": tuple(draw.candidates)})()
    diag = Diagnoser(tuned.model, t.scorer.pw, tail, ratios=(0.5,), fill=fill)
    got = diag.score_case(case, None, only=["overlap@0.5"])["overlap@0.5"]
    torch.testing.assert_close(torch.tensor(got), want.float(), rtol=1e-4, atol=1e-4)
    for other in (naive, full):
        assert max(abs(served.scores[c] - other.scores[c]) for c in draw.candidates) > 1e-4


def test_late_reuse_path_equals_the_engines_late_method(tiny_ft_config, fav_dataset, tmp_path):
    """train.reuse_select=late trains on what the engine's late method serves at that layer
    (item KV from the store below it, every item token computed from it up, the user side
    exact): the trainer's reuse path — its first scoring (the chunk pass joined at the layer)
    and its cached one (the frozen layers' outputs reused) — and the diagnostics' late@s give
    the engine's scores, which differ from naive reuse and from full."""
    from rcllm.config import ReuseConfig
    from rcllm.errors import RcllmError
    from rcllm.finetune.diagnose import Diagnoser

    cfg = tiny_ft_config(candidates=3, steps=3, lr=5e-2, reuse_select="late", late_layer=1,
                         first_layer=1)
    t = _trainer(cfg, fav_dataset, tmp_path / "l")
    assert t.fast_path() == {"method": "late", "late_layer": 1, "item_tail": 1,
                             "user_side": "exact"}
    assert t.scorer.cache is not None     # the frozen layers' outputs are cached (layer 1)
    t.run(progress=False)
    tuned = load_model(dataclasses.replace(cfg.model, adapter=str(tmp_path / "l")))
    draw = t.stream.draw(0)
    served, naive, full = _engine_scores(
        tuned, cfg, fav_dataset, t,
        ReuseConfig(prefix_insert=False, late_layer=1, user_side="exact"), "late")
    want = torch.tensor([served.scores[c] for c in draw.candidates])
    ex = draw.example
    patch = LoraPatch(t.model, Lora(cfg.lora, read_adapter(tmp_path / "l")[0]), t._base)
    patch.install()
    with torch.no_grad():
        got = [t.scores(ex.user_id, ex.history, draw.candidates, ("full", "reuse")).scores
               for _ in range(2)]           # the second from the frozen layers' cache
    patch.restore()
    assert t.scorer.cache.hits >= 1
    for joint in got:
        torch.testing.assert_close(joint["reuse"], want, rtol=1e-4, atol=1e-4)
    case = type("Case", (), {"user_id": ex.user_id, "history": ex.history,
                             "candidates": tuple(draw.candidates)})()
    diag = Diagnoser(tuned.model, t.scorer.pw, 1, depths=(1,))
    late = diag.score_case(case, None, only=["late@1"])["late@1"]
    torch.testing.assert_close(torch.tensor(late), want.float(), rtol=1e-4, atol=1e-4)
    for other in (naive, full):
        assert max(abs(served.scores[c] - other.scores[c]) for c in draw.candidates) > 1e-4
    with pytest.raises(RcllmError, match="late_layer=0"):
        tiny_ft_config(reuse_select="late", late_layer=0)   # late@0 is the full path
