"""A training run's resumable state: `TrainState` (JSON) and the checkpoint on disk.

`<adapter folder>/checkpoint/` holds `state.safetensors` (the LoRA factors and the AdamW
moments), `best.safetensors` (the factors of the best validation so far) and `state.json`
(the run key, AdamW's step count and the `TrainState`). Files are written atomically, so a run
stopped mid-write keeps the previous checkpoint.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import RcllmError
from .adapter import write_atomic
from .optim import AdamW

CHECKPOINT = "checkpoint"
BEST = "best.safetensors"  # in CHECKPOINT: the factors of the best validation so far


@dataclass
class TrainState:
    """What a checkpoint restores besides tensors (JSON)."""

    step: int = 0                                      # optimiser steps completed
    train: list[dict] = field(default_factory=list)    # per step: means over its prompts
    val: list[dict] = field(default_factory=list)      # per validation (validate.validate)
    best_step: int | None = None                       # step of the kept (best) weights
    best_score: float = -math.inf                      # its validation NDCG@10 (paths' mean)
    since_best: int = 0                                # validations since it
    stopped_early: bool = False
    elapsed_s: float = 0.0                             # training time over all sessions
    prompts: int = 0                                   # training prompts scored
    val_s: float = 0.0                                 # of elapsed_s, spent validating


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    write_atomic(path, lambda tmp: save_file(
        {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp))


def save_best(folder: Path, best: dict[str, torch.Tensor]) -> None:
    _save_tensors(folder / CHECKPOINT / BEST, best)


def save_checkpoint(folder: Path, key: str, factors: dict[str, torch.Tensor], opt: AdamW,
                    state: TrainState) -> None:
    ck = folder / CHECKPOINT
    _save_tensors(ck / "state.safetensors", {**factors, **opt.state_tensors()})
    meta = {"key": key, "adam_t": opt.t, **asdict(state)}
    write_atomic(ck / "state.json", lambda tmp: Path(tmp).write_text(json.dumps(meta)))


def load_checkpoint(folder: Path, key: str, factors: dict[str, torch.Tensor], opt: AdamW
                    ) -> tuple[TrainState, dict[str, torch.Tensor] | None] | None:
    """Restores `factors` and `opt` in place from the folder's checkpoint; returns the state
    and the best factors so far, or None when there is no checkpoint. A checkpoint of another
    run (key) or an unreadable one is refused: `--fresh` discards it."""
    ck = folder / CHECKPOINT
    if not (ck / "state.json").is_file():
        return None
    try:
        meta = json.loads((ck / "state.json").read_text())
        tensors = load_file(str(ck / "state.safetensors"))
        best = load_file(str(ck / BEST)) if meta.get("best_step") is not None else None
    except (OSError, ValueError) as exc:
        raise RcllmError(f"checkpoint in {ck} is unreadable ({exc}); re-run with --fresh") from None
    if meta.get("key") != key:
        raise RcllmError(f"checkpoint in {ck} belongs to another run; re-run with --fresh")
    with torch.no_grad():
        for k, p in factors.items():
            p.copy_(tensors[k])
    opt.load_state(tensors, int(meta.pop("adam_t")))
    meta.pop("key")
    return TrainState(**meta), best
