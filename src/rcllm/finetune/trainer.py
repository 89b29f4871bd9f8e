"""The fine-tuning loop: listwise verbalizer loss, checkpoints, resume, the adapter folder.

Loss (`train.objective`), both through the transformer's exact forward with the LoRA-patched
weights:
- pointwise (default): the engine's pointwise prompt — the user side, then one block per
  candidate "Will I like <item chunk>? Answer:" — through the engine's selective prefill; each
  candidate's score is its " Yes" − " No" logit, and the loss is the cross-entropy of the target
  among the candidates' scores (a softmax over candidates, so every step contrasts the target
  with popularity negatives). This is what the engine's pointwise scorer ranks by.
  `train.reuse` (reuse-aware, after Block-Attention / KVLink): the item chunks' KV comes from a
  pass over the template context and the chunk only, as the chunk store holds it.
  `train.distill` = d adds a teacher: the `train.init` adapter's full path (frozen, no graph)
  scores the same candidates, and the loss becomes (1 − d)·cross-entropy + d·KL(teacher ‖
  student) over the candidates — a dense target per step (every candidate's share, not only
  which one is the target) that asks the reuse path to rank as the full path does.
- listwise: the engine's listwise prompt (PromptBuilder, verbalizer question); cross-entropy of
  the target's label among the candidate labels at the last position — the softmax the
  verbalizer scorer ranks by (`prefill.scoring.verbalizer_scores`).

Folder: `<cache root>/adapters/<key>/`, key = sha256(base model fingerprint, dataset digest,
the options that change the weights). It holds `checkpoint/` (factors + AdamW state as
safetensors, `state.json` with the step and the loss so far) while training and
`adapter.safetensors` + `adapter.json` when done. Running the same command again resumes from
the last checkpoint, or returns the finished adapter at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..errors import RcllmError
from ..model.loading import LoadedModel, cache_root
from ..config import ReuseConfig
from ..prefill.scoring import yes_no_logits
from ..prefill.selection import SelectionPolicy
from ..prefill.selective import Layout, PrefillInputs, prefill
from ..prompt.builder import PromptBuilder, RankRequest
from ..records import Dataset, UserId
from .adapter import read_adapter, read_manifest, save_adapter, write_atomic
from .config import FinetuneConfig
from .data import ExampleStream, dataset_digest
from .lora import Lora, LoraPatch, base_weights
from .optim import AdamW, clip_grad_norm, lr_at

log = logging.getLogger(__name__)
CHECKPOINT = "checkpoint"


def run_key(base_fingerprint: str, data_digest: str, cfg: FinetuneConfig) -> str:
    text = json.dumps({"model": base_fingerprint, "data": data_digest,
                       "config": cfg.key_fields()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def adapter_folder(cfg: FinetuneConfig, key: str) -> Path:
    return cache_root(cfg.model) / "adapters" / key


@dataclass
class TrainState:
    """What a checkpoint restores besides tensors (JSON)."""

    step: int = 0                                     # steps completed
    losses: list[float] = field(default_factory=list)  # cross-entropy of the target, per step
    kls: list[float] = field(default_factory=list)     # KL(teacher || student), with distill
    hits: list[int] = field(default_factory=list)      # target ranked first (before the update)
    elapsed_s: float = 0.0                            # training time over all sessions


class Trainer:
    """Trains one adapter; `run()` returns the folder of the finished adapter."""

    def __init__(self, loaded: LoadedModel, ds: Dataset, train_users: list[UserId],
                 cfg: FinetuneConfig, folder: Path, key: str):
        self.loaded, self.model, self.cfg, self.folder, self.key = (
            loaded, loaded.model, cfg, folder, key)
        self.ds, self.train_users = ds, train_users
        self.builder = PromptBuilder(loaded.tokenizer, ds.items, cfg.prompt,
                                     self.model.arch.max_positions, "verbalizer")
        t = cfg.train
        self.stream = ExampleStream(ds, train_users, t.targets, cfg.prompt.history_window,
                                    t.candidates, t.seed)
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
        self.pointwise = None
        self._reuse_cfg = ReuseConfig(method="naive")  # compute what is not given, as it is
        if t.objective == "pointwise":
            from ..prompt.pointwise import PointwisePrompt

            self.pointwise = PointwisePrompt(self.builder, self.model.arch.max_positions)

    def _warm_start(self, path: str) -> None:
        """Copies a finished adapter's factors in, after checking that it was trained on the
        same model, data, user split, prompt and LoRA shape (a different split could have
        trained on this run's held-out users)."""
        factors, m = read_adapter(path)
        want = {**self._identity(), "data.digest": dataset_digest(self.ds)}
        have = {**m, "data.digest": m.get("data", {}).get("digest")}
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

    # ---- one step -----------------------------------------------------------------------
    def loss_at(self, step: int, teacher: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        """Step `step`'s prompt under the current factors (graph kept for backward): the loss
        optimised, the target's cross-entropy, the KL from `teacher` scores (when given) and
        whether the target scored highest."""
        draw = self.stream.draw(step)
        scores = (self.pointwise_scores(draw) if self.pointwise is not None
                  else self.listwise_scores(draw))
        ce = F.cross_entropy(scores.unsqueeze(0),
                             torch.tensor([draw.target_index], device=scores.device))
        hit = int(scores.argmax()) == draw.target_index
        if teacher is None:
            return ce, ce, None, hit
        kl = F.kl_div(F.log_softmax(scores, -1), F.log_softmax(teacher, -1), log_target=True,
                      reduction="sum")
        d = self.cfg.train.distill
        return (1 - d) * ce + d * kl, ce, kl, hit

    def teacher_scores(self, step: int) -> torch.Tensor:
        """The teacher's candidate scores for step `step`: the init adapter's factors on the
        full path (every item chunk computed in the prompt), without a graph. Leaves the
        teacher's weights installed: install the student's after."""
        LoraPatch(self.model, self.teacher, self._base).install()
        with torch.no_grad():
            return self.pointwise_scores(self.stream.draw(step), reuse=False)

    def listwise_scores(self, draw) -> torch.Tensor:
        """The candidate labels' logits [C] at the last position of the listwise prompt."""
        ex = draw.example
        prompt = self.builder.build(RankRequest(ex.user_id, ex.history, draw.candidates))
        ids = torch.tensor(prompt.token_ids, device=self.model.device)
        return self.model.forward(ids)["logits"][list(prompt.label_token_ids)].float()

    def pointwise_scores(self, draw, reuse: bool | None = None) -> torch.Tensor:
        """Each candidate's yes/no log-odds [C] from the engine's pointwise prompt (user side,
        then one block per candidate seeing the user side and itself) through the engine's
        selective prefill with the graph kept. With `train.reuse` each item chunk's KV comes
        from a pass where it sees only its template context (instruction + block head) and
        itself — what the chunk store holds at inference — and the rest of the prompt is
        computed over that KV; with `train.reuse_tail` = k the last k tokens of each item
        chunk are computed in the prompt instead (what `reuse.item_tail` recomputes).
        `reuse=False` scores the full path whatever the run's setting (the teacher's)."""
        ex, pw = draw.example, self.pointwise
        prompt = pw.prompt(RankRequest(ex.user_id, ex.history, draw.candidates))
        segments = prompt.slot_segments()
        ids = [t for seg in segments for t in seg.token_ids]
        items = []  # slot ranges of the item chunks
        at = 0
        for seg in segments:
            if seg.kind == "item":
                items.append((at, at + len(seg.token_ids), seg.token_ids))
            at += len(seg.token_ids)
        reused = None
        if self.cfg.train.reuse if reuse is None else reuse:
            ctx = list(pw.instruction_ids) + list(pw.context_ids("item"))
            chunk_ids = ctx + [t for _, _, c in items for t in c]
            ranges, s = [], len(ctx)
            for _, _, c in items:
                ranges.append((s, s + len(c)))
                s += len(c)
            inp = self._inputs(chunk_ids, ranges)
            prefill(self.model, inp, SelectionPolicy(self._reuse_cfg), grad=True)
            reused = (inp, ranges)
        inp = self._inputs(ids, prompt.block_ranges())
        if reused is not None:
            chunk_inp, ranges = reused
            tail = self.cfg.train.reuse_tail  # computed here, seeing the user side
            for (s, e, _), (cs, ce) in zip(items, ranges):
                e, ce = max(s, e - tail), max(cs, ce - tail)
                for layer in range(self.model.arch.num_layers):
                    inp.k_buf[layer][:, s:e] = chunk_inp.k_buf[layer][:, cs:ce]
                    inp.v_buf[layer][:, s:e] = chunk_inp.v_buf[layer][:, cs:ce]
                inp.have_kv[s:e] = True
        res = prefill(self.model, inp, SelectionPolicy(self._reuse_cfg), grad=True)
        h = self.model.final_hidden(res.hidden_out)
        logits = yes_no_logits(self.model, h, pw.yes_id, pw.no_id)
        return logits[:, 0] - logits[:, 1]

    def _inputs(self, ids: list[int], blocks) -> PrefillInputs:
        """Prefill inputs with every slot fresh and per-layer KV buffers (autograd-safe)."""
        a, dev, n = self.model.arch, self.model.device, len(ids)
        t = torch.tensor(ids, device=dev)

        def bufs():
            return [torch.zeros(a.num_kv_heads, n, a.head_dim, dtype=self.model.dtype,
                                device=dev) for _ in range(a.num_layers)]

        none = torch.zeros(n, dtype=torch.bool, device=dev)
        return PrefillInputs(t, bufs(), bufs(), none.clone(), none.clone(),
                             torch.zeros(n, dtype=torch.int8, device=dev),
                             torch.zeros(n, dtype=torch.long, device=dev),
                             layout=Layout(n, blocks, dev))

    def _step(self, patch: LoraPatch, step: int) -> None:
        t = self.cfg.train
        teacher = self.teacher_scores(step) if self.teacher is not None else None
        patch.install()
        loss, ce, kl, hit = self.loss_at(step, teacher)
        loss.backward()
        clip_grad_norm(self.lora.factors, t.grad_clip)
        self.opt.step(lr_at(step, t.steps, t.lr, t.warmup_steps))
        self.opt.zero_grad()
        self.state.step = step + 1
        self.state.losses.append(float(ce.detach()))
        if kl is not None:
            self.state.kls.append(float(kl.detach()))
        self.state.hits.append(int(hit))

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        ck = self.folder / CHECKPOINT
        tensors = {**{k: v.detach() for k, v in self.lora.factors.items()},
                   **self.opt.state_tensors()}
        write_atomic(ck / "state.safetensors", lambda tmp: save_file(
            {k: v.contiguous().cpu() for k, v in tensors.items()}, tmp))
        meta = {"key": self.key, "adam_t": self.opt.t, **asdict(self.state)}
        write_atomic(ck / "state.json", lambda tmp: Path(tmp).write_text(json.dumps(meta)))

    def try_resume(self) -> bool:
        ck = self.folder / CHECKPOINT
        if not (ck / "state.json").is_file():
            return False
        try:
            meta = json.loads((ck / "state.json").read_text())
            tensors = load_file(str(ck / "state.safetensors"))
        except (OSError, ValueError) as exc:
            raise RcllmError(f"checkpoint in {ck} is unreadable ({exc}); re-run with --fresh") from None
        if meta.get("key") != self.key:
            raise RcllmError(f"checkpoint in {ck} belongs to another run; re-run with --fresh")
        with torch.no_grad():
            for k, p in self.lora.factors.items():
                p.copy_(tensors[k])
        self.opt.load_state(tensors, int(meta["adam_t"]))
        self.state = TrainState(meta["step"], meta["losses"], meta.get("kls", []), meta["hits"],
                                meta["elapsed_s"])
        return True

    # ---- the loop -------------------------------------------------------------------------
    def run(self, progress: bool = True, stop_after: int | None = None) -> Path | None:
        """Trains to `train.steps` (resuming if a checkpoint exists) and saves the adapter.

        `stop_after` ends the session early after that many steps with a checkpoint (tests
        use it to interrupt); returns None then, else the adapter folder.
        """
        from tqdm import tqdm

        t = self.cfg.train
        if self.try_resume():
            log.info("resuming %s at step %d", self.folder, self.state.step)
        patch = LoraPatch(self.model, self.lora, self._base)
        bar = tqdm(total=t.steps, initial=self.state.step, desc="finetune", unit="step",
                   disable=not progress)
        start, done = time.perf_counter(), 0
        try:
            while self.state.step < t.steps:
                self._step(patch, self.state.step)
                done += 1
                bar.update(1)
                window = self.state.losses[-t.log_every:]
                post = {"loss": f"{sum(window) / len(window):.3f}"}
                if self.state.kls:
                    kls = self.state.kls[-t.log_every:]
                    post["kl"] = f"{sum(kls) / len(kls):.3f}"
                bar.set_postfix(post)
                if self.state.step % t.checkpoint_every == 0 or (stop_after and done >= stop_after):
                    self.state.elapsed_s += time.perf_counter() - start
                    start = time.perf_counter()
                    self.save_checkpoint()
                if stop_after and done >= stop_after and self.state.step < t.steps:
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

    def _finish(self) -> Path:
        t = self.cfg.train
        def mean(xs, i):
            return sum(xs[i:i + t.log_every]) / len(xs[i:i + t.log_every])

        # [step, cross-entropy of the target, training top-1 (, KL to the teacher)]
        curve = [[min(i + t.log_every, len(self.state.losses)), mean(self.state.losses, i),
                  mean(self.state.hits, i)] + ([mean(self.state.kls, i)] if self.state.kls else [])
                 for i in range(0, len(self.state.losses), t.log_every)]
        manifest = {
            **self._identity(), "key": self.key, "scale": self.cfg.lora.scale,
            "data": {"name": self.ds.name, "digest": dataset_digest(self.ds),
                     "train_users": len(self.train_users), "examples": len(self.stream)},
            "train": {**asdict(t), "init_sha256": self.init_sha256},
            "model": {"dtype": self.cfg.model.dtype, "threads": self.cfg.model.threads},
            "loss_curve": curve, "train_seconds": round(self.state.elapsed_s, 1),
        }
        path = save_adapter(self.folder, self.lora.factors, manifest)
        shutil.rmtree(self.folder / CHECKPOINT, ignore_errors=True)
        log.info("adapter written: %s", path)
        return self.folder


def finished(folder: Path) -> bool:
    try:
        read_manifest(folder)
        return True
    except RcllmError:
        return False
