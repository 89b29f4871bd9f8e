"""The fine-tuning loop: the joint objective, accumulation, validation, checkpoints, resume.

Loss (`train.objective`), through the transformer's exact forward with the LoRA-patched
weights:
- pointwise (default): the engine's pointwise prompt — the user side, then one block per
  candidate "Will I like <item chunk>? Answer:" — scored by `paths.PathScorer`; a candidate's
  score is its " Yes" − " No" logit and a path's loss the cross-entropy of the target among the
  candidates' scores. `train.path`:
  - joint (default): every prompt is scored on the full path and on the reuse path (item
    chunks as the chunk store holds them, the last `train.reuse_tail` tokens computed in the
    prompt), on the same weights; loss = CE(full) + CE(reuse) + `train.match`·KL(full, no
    gradient ‖ reuse) (+ `train.hidden_match`·MSE of the answer slots' hidden states; on the
    late path + `train.late_distill`·the item tokens' K/V mismatch above the join). Neither
    path can collapse without its own cross-entropy showing it.
  - full / reuse: one path's cross-entropy (reuse: optionally distilled from the `train.init`
    adapter's full path, `train.distill`).
- listwise: the engine's listwise prompt; cross-entropy of the target's label among the
  candidate labels at the last position.

A step accumulates `train.batch` prompts. The run lasts `train.steps`, or `train.epochs`
passes over the training examples; every `train.val_every` steps (default: four times an epoch)
the validation users' evaluation cases are scored on the trained paths, the factors with the
lowest mean target cross-entropy over the paths are kept (never test users), and
`train.patience` validations without a lower one stop the run.

Folder: `<cache root>/adapters/<key>/`, key = sha256(base model fingerprint, dataset digest,
the options that change the weights, the example count when `train.max_examples` binds). It holds `checkpoint/` (factors + AdamW state and the
best factors as safetensors, `state.json` with the step, the curves and the best so far) while
training and `adapter.safetensors` + `adapter.json` + `curves.json` + `curves.png` when done.
Running the same command again resumes from the last checkpoint, or returns the finished
adapter at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..errors import RcllmError
from ..model.loading import LoadedModel, cache_root
from ..prompt.builder import PROMPT_VERSION, PromptBuilder, RankRequest
from ..records import Dataset, UserId
from . import curves
from .adapter import (check_prompt_version, read_adapter, read_manifest, save_adapter,
                      trained_prompt)
from .config import FinetuneConfig
from .data import Draw, dataset_digest, training_stream
from .lora import Lora, LoraPatch, base_weights
from .optim import AdamW, clip_grad_norm, lr_at
from .overfit import overfit as run_overfit
from .paths import PathScorer, PathScores, overlap_policy
from .state import CHECKPOINT, TrainState, load_checkpoint, save_best, save_checkpoint
from .validate import validate, validation_cases

log = logging.getLogger(__name__)


def run_key(base_fingerprint: str, data_digest: str, cfg: FinetuneConfig,
            capped: int | None = None) -> str:  # capped: the count train.max_examples kept
    fields = {"model": base_fingerprint, "data": data_digest, "config": cfg.key_fields()}
    text = json.dumps(fields | ({"examples": capped} if capped else {}), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def adapter_folder(cfg: FinetuneConfig, key: str) -> Path:
    return cache_root(cfg.model) / "adapters" / key


class Trainer:
    """Trains one adapter; `run()` returns the folder of the finished adapter."""

    def __init__(self, loaded: LoadedModel, ds: Dataset, train_users: list[UserId],
                 cfg: FinetuneConfig, folder: Path, key: str,
                 val_users: Sequence[UserId] = ()):
        self.loaded, self.model, self.cfg, self.folder, self.key = (
            loaded, loaded.model, cfg, folder, key)
        self.ds, self.train_users = ds, train_users
        self.builder = PromptBuilder(loaded.tokenizer, ds.items, cfg.prompt,
                                     self.model.arch.max_positions, "verbalizer")
        t = cfg.train
        self.stream = training_stream(ds, train_users, cfg)
        self.val_cases = validation_cases(ds, val_users, t.val_candidates, t.val_users)
        self._base = base_weights(self.model)  # before any patch: shared by student, teacher
        self.lora = Lora.init(self.model.arch, cfg.lora, t.seed, self.model.dtype,
                              str(self.model.device))
        self.init_sha256 = None
        self.teacher = None  # the init adapter's factors (frozen) when distilling
        if t.init:
            self._warm_start(t.init)
        if t.distill:
            self.teacher = Lora(cfg.lora, {k: p.detach().clone()
                                           for k, p in self.lora.factors.items()})
        self.opt = AdamW(self.lora.factors, weight_decay=t.weight_decay)
        self.state = TrainState()
        self.best: dict[str, torch.Tensor] | None = None  # factors of the best validation
        self.scorer = None
        if t.objective == "pointwise":
            from ..prompt.pointwise import PointwisePrompt

            pw = PointwisePrompt(self.builder, self.model.arch.max_positions)
            select = (overlap_policy(t.reuse_ratio, t.reuse_fill)
                      if t.reuse_select == "overlap" else None)
            late = t.late_layer if t.reuse_select == "late" and t.path != "full" else 0
            if late >= self.model.arch.num_layers:
                raise RcllmError(f"train.late_layer={late} but the model has "
                                 f"{self.model.arch.num_layers} layers")
            self.scorer = PathScorer(self.model, pw, t.reuse_tail, cfg.lora.first_layer,
                                     int(t.frozen_cache_gb * 2**30), select, late,
                                     t.item_cache, t.late_distill > 0)

    @property
    def total_steps(self) -> int:
        t = self.cfg.train
        return t.steps or max(1, math.ceil(t.epochs * len(self.stream) / t.batch))

    @property
    def val_every(self) -> int:
        t = self.cfg.train
        return t.val_every or max(1, math.ceil(len(self.stream) / t.batch / 4))

    def _warm_start(self, path: str) -> None:
        """Copies a finished adapter's factors in, after checking that it was trained on the
        same model, data, user split, prompt and LoRA shape (a different split could have
        trained on this run's held-out users)."""
        factors, m = read_adapter(path)
        check_prompt_version(m, path)
        want = {**self._identity(), "data.digest": dataset_digest(self.ds)}
        have = {**m, "data.digest": m.get("data", {}).get("digest"),
                "prompt": asdict(trained_prompt(m))}
        bad = [k for k, v in want.items() if have.get(k) != v]
        if bad:
            raise RcllmError(f"train.init={path} does not match this run in {', '.join(bad)}; "
                             f"warm-start only from an adapter of the same model, data, user "
                             f"split, prompt and LoRA shape")
        if set(factors) != set(self.lora.factors):
            raise RcllmError(f"train.init={path} holds other LoRA factors than this run")
        with torch.no_grad():
            for k, p in self.lora.factors.items():
                p.copy_(factors[k].to(p.dtype))
        self.init_sha256 = m["sha256"]

    def _identity(self) -> dict:
        """The manifest fields an adapter must share with a run that warm-starts from it:
        base model, LoRA shape, prompt settings and user split."""
        cfg, t = self.cfg, self.cfg.train
        return {"base_fingerprint": self.loaded.fingerprint, "rank": cfg.lora.rank,
                "alpha": cfg.lora.alpha, "targets": list(cfg.lora.target_list),
                "first_layer": cfg.lora.first_layer, "prompt": asdict(cfg.prompt),
                "split": {"fractions": list(t.fractions), "seed": t.split_seed}}

    # ---- one prompt -------------------------------------------------------------------------
    def scores(self, user_id, history, candidates, paths: tuple[str, ...]) -> PathScores:
        """Candidate scores on `paths` under the factors installed now (graph kept)."""
        if self.scorer is None:  # listwise: the verbalizer labels' logits, full path only
            prompt = self.builder.build(RankRequest(user_id, history, candidates))
            ids = torch.tensor(prompt.token_ids, device=self.model.device)
            logits = self.model.forward(ids)["logits"][list(prompt.label_token_ids)].float()
            return PathScores({"full": logits}, {})
        return self.scorer.score(user_id, history, candidates, paths)

    def loss_at(self, i: int, teacher: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
        """Training prompt `i`'s loss under the installed factors (graph kept) and its
        statistics: the target's cross-entropy and top-1 hit per path, the KL of the reuse
        path from the full one (joint) or from `teacher` scores (distill)."""
        return self.loss_of(self.stream.draw(i), teacher)

    def loss_of(self, draw: Draw, teacher: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
        t, ex = self.cfg.train, draw.example
        out = self.scores(ex.user_id, ex.history, draw.candidates, t.paths)
        target = torch.tensor([draw.target_index], device=self.model.device)
        loss, stats = 0.0, {}
        for path, s in out.scores.items():
            ce = F.cross_entropy(s.unsqueeze(0), target)
            loss = loss + ce
            stats[f"ce_{path}"] = float(ce.detach())
            stats[f"top1_{path}"] = float(int(s.argmax()) == draw.target_index)
        if t.path == "joint":
            full, reuse = out.scores["full"], out.scores["reuse"]
            kl = F.kl_div(F.log_softmax(reuse, -1), F.log_softmax(full.detach(), -1),
                          log_target=True, reduction="sum")
            loss = loss + t.match * kl
            stats["kl"] = float(kl.detach())
            if t.hidden_match:
                hid = (out.hidden["reuse"] - out.hidden["full"].detach()).pow(2).mean()
                loss = loss + t.hidden_match * hid
                stats["hidden_mse"] = float(hid.detach())
            if out.late_kv is not None:     # train.late_distill: the items' K/V above the join
                loss = loss + t.late_distill * out.late_kv
                stats["late_kv"] = float(out.late_kv.detach())
        elif teacher is not None:  # distill: (1 − d)·CE + d·KL(teacher ‖ reuse path)
            d = t.distill
            kl = F.kl_div(F.log_softmax(out.scores["reuse"], -1),
                          F.log_softmax(teacher, -1), log_target=True, reduction="sum")
            loss = (1 - d) * loss + d * kl
            stats["kl"] = float(kl.detach())
        stats["loss"] = float(loss.detach())
        return loss, stats

    def teacher_scores(self, i: int) -> torch.Tensor:
        """The teacher's candidate scores for prompt `i`: the init adapter's factors on the
        full path, without a graph. Leaves the teacher's weights installed: install the
        student's after."""
        LoraPatch(self.model, self.teacher, self._base).install()
        draw = self.stream.draw(i)
        with torch.no_grad():
            ex = draw.example
            return self.scores(ex.user_id, ex.history, draw.candidates, ("full",)).scores["full"]

    # ---- one step ---------------------------------------------------------------------------
    def _step(self, patch: LoraPatch, step: int) -> None:
        """Accumulates the gradients of the step's `train.batch` prompts, then updates."""
        t = self.cfg.train
        rows = []
        for j in range(t.batch):
            i = step * t.batch + j
            teacher = self.teacher_scores(i) if self.teacher is not None else None
            patch.install()  # per prompt: each backward frees the graph of the update
            loss, stats = self.loss_at(i, teacher)
            (loss / t.batch).backward()
            rows.append(stats)
        clip_grad_norm(self.lora.factors, t.grad_clip)
        total = self.total_steps   # a short run warms up over a tenth of it at most
        lr = lr_at(step, total, t.lr, min(t.warmup_steps, max(1, total // 10)))
        self.opt.step(lr)
        self.opt.zero_grad()
        self.state.step = step + 1
        self.state.prompts += t.batch
        self.state.train.append({"step": step + 1, "lr": lr,
                                 **{k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}})

    def _validate(self, patch: LoraPatch, progress: bool) -> None:
        """Scores the validation cases with the current factors; keeps them when best."""
        start = time.perf_counter()
        patch.install()
        paths = self.cfg.train.paths

        def score(case):
            return self.scores(case.user_id, case.history, case.candidates, paths).scores

        row = {"step": self.state.step, **validate(score, self.val_cases, progress)}
        self.state.val.append(row)
        if row["score"] > self.state.best_score:
            self.state.best_score, self.state.best_step, self.state.since_best = (
                row["score"], self.state.step, 0)
            self.best = {k: v.detach().clone() for k, v in self.lora.factors.items()}
            save_best(self.folder, self.best)
        else:
            self.state.since_best += 1
        self.state.val_s += time.perf_counter() - start
        log.info("validation at step %d: %s", self.state.step,
                 ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "step"))

    def overfit(self, examples: int, steps: int, progress: bool = False) -> list[dict]:
        """The overfit check on this run's path (finetune.overfit)."""
        return run_overfit(self, examples, steps, progress)

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        save_checkpoint(self.folder, self.key, self.lora.factors, self.opt, self.state)

    def try_resume(self) -> bool:
        found = load_checkpoint(self.folder, self.key, self.lora.factors, self.opt)
        if found is not None:
            self.state, self.best = found
        return found is not None

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, progress: bool = True, stop_after: int | None = None) -> Path | None:
        """Trains to the total step count or an early stop (resuming if a checkpoint exists)
        and saves the adapter: the factors of the best validation, or the last ones without
        validation users.

        `stop_after` ends the session early after that many steps with a checkpoint (tests
        use it to interrupt); returns None then, else the adapter folder.
        """
        from tqdm import tqdm

        t, total = self.cfg.train, self.total_steps
        if self.try_resume():
            log.info("resuming %s at step %d", self.folder, self.state.step)
        patch = LoraPatch(self.model, self.lora, self._base)
        bar = tqdm(total=total, initial=self.state.step, desc="finetune", unit="step",
                   disable=not progress)
        start, done = time.perf_counter(), 0
        try:
            if self.val_cases and not self.state.val:  # the starting point, for the curves
                self._validate(patch, progress)
            while self.state.step < total and not self.state.stopped_early:
                self._step(patch, self.state.step)
                done += 1
                bar.update(1)
                bar.set_postfix({k: f"{v:.3f}" for k, v in self.state.train[-1].items()
                                 if k.startswith(("ce_", "kl"))})
                step = self.state.step
                if self.val_cases and (step % self.val_every == 0 or step == total):
                    self._validate(patch, progress)
                    if t.patience and self.state.since_best >= t.patience:
                        self.state.stopped_early = True
                        log.info("early stop at step %d: no lower validation cross-entropy "
                                 "in %d validations (best at step %s)", step, t.patience,
                                 self.state.best_step)
                if step % t.checkpoint_every == 0 or (stop_after and done >= stop_after):
                    self.state.elapsed_s += time.perf_counter() - start
                    start = time.perf_counter()
                    self.save_checkpoint()
                if stop_after and done >= stop_after and step < total:
                    return None
        except KeyboardInterrupt:
            log.warning("interrupted: the next run resumes from the last checkpoint (step %d)",
                        (self.state.step // t.checkpoint_every) * t.checkpoint_every)
            raise
        finally:
            patch.restore()
            bar.close()
        self.state.elapsed_s += time.perf_counter() - start
        return self._finish()

    def fast_path(self) -> dict | None:
        """The fast path the adapter was trained for (None: the full path only)."""
        t = self.cfg.train
        if t.path == "full":
            return None
        if t.reuse_select == "late":
            return {"method": "late", "late_layer": t.late_layer, "item_tail": t.reuse_tail,
                    "user_side": "exact"}
        if t.reuse_select == "overlap":
            return {"method": "rcllm", "rcllm_select": "overlap", "item_ratio": t.reuse_ratio,
                    "history_ratio": t.reuse_ratio, "item_tail": t.reuse_tail,
                    "user_side": "exact",
                    **({"overlap_fill": t.reuse_fill} if t.reuse_fill != "order" else {})}
        return {"method": "naive", "item_tail": t.reuse_tail, "user_side": "exact"}

    def _finish(self) -> Path:
        t, st = self.cfg.train, self.state
        data = curves.curves(st.train, st.val, t.log_every, t.candidates, t.val_candidates,
                             st.best_step)
        factors = self.best if self.best is not None else self.lora.factors
        manifest = {
            **self._identity(), "key": self.key, "scale": self.cfg.lora.scale,
            "prompt_version": PROMPT_VERSION, "fast_path": self.fast_path(),
            "data": {"name": self.ds.name, "digest": dataset_digest(self.ds),
                     "train_users": len(self.train_users), "examples": len(self.stream),
                     "validation_users": len(self.val_cases)},
            "train": {**asdict(t), "init_sha256": self.init_sha256},
            "model": {"dtype": self.cfg.model.dtype, "threads": self.cfg.model.threads},
            "steps_done": st.step, "stopped_early": st.stopped_early,
            "best": {"step": st.best_step, **(st.val[[r["step"] for r in st.val].index(
                st.best_step)] if st.best_step is not None else {})},
            "train_seconds": round(st.elapsed_s, 1), "validation_seconds": round(st.val_s, 1),
            "train_prompts": st.prompts,   # prompts/s: training prompts over the time spent
            "prompts_per_s": (round(st.prompts / (st.elapsed_s - st.val_s), 4)  # on them
                              if st.elapsed_s > st.val_s else None),
        }
        path = save_adapter(self.folder, factors, manifest)
        curves.save(self.folder, data, f"{self.ds.name} · {t.path} · key {self.key[:12]}")
        shutil.rmtree(self.folder / CHECKPOINT, ignore_errors=True)
        log.info("adapter written: %s", path)
        return self.folder


def finished(folder: Path) -> bool:
    try:
        read_manifest(folder)
        return True
    except RcllmError:
        return False
