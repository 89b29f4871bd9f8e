"""The overfit check (STYLE.md, last section): before a recipe is judged, a handful of fixed
prompts must reach near-zero loss on the path in question. `rcllm finetune --overfit N`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lora import LoraPatch
from .optim import clip_grad_norm

if TYPE_CHECKING:
    from .trainer import Trainer


def overfit(trainer: "Trainer", examples: int, steps: int, progress: bool = False) -> list[dict]:
    """Trains on prompts 0..examples-1 only (fixed candidates), all of them every step, at
    the run's learning rate without decay; returns the per-step statistics. A recipe whose
    loss cannot approach zero here is blocked by the model or the path, not the data.
    Saves nothing."""
    from tqdm import tqdm

    draws = [trainer.stream.draw(i) for i in range(examples)]
    patch = LoraPatch(trainer.model, trainer.lora, trainer._base)
    rows = []
    bar = tqdm(range(steps), desc="overfit", disable=not progress)
    try:
        for step in bar:
            stats = []
            for d in draws:
                patch.install()
                loss, st = trainer.loss_of(d)
                (loss / len(draws)).backward()
                stats.append(st)
            clip_grad_norm(trainer.lora.factors, trainer.cfg.train.grad_clip)
            trainer.opt.step(trainer.cfg.train.lr)
            trainer.opt.zero_grad()
            rows.append({"step": step + 1,
                         **{k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}})
            bar.set_postfix({k: f"{v:.3f}" for k, v in rows[-1].items()
                             if k.startswith(("ce_", "kl"))})
    finally:
        patch.restore()
    return rows
