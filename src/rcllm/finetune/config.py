"""Options of `rcllm finetune` as frozen dataclasses (loaded like RcllmConfig: YAML + --set).

The prompt defaults are shorter than the engine's (5 reviews of at most 32 tokens, enough for
the review's date, rating and item title; item texts of at most 16 tokens) so that the default
run (720 pointwise steps of 8 candidates) fits in under an hour on two CPU cores (measured on
one: docs/finetune.md). The adapter records its prompt settings and objective, and
`rcllm eval --adapter` adopts them, so a ranker is evaluated on the prompts it was trained on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..config import ModelConfig, PromptConfig, opt
from ..errors import RcllmError

LORA_TARGETS = ("q", "k", "v", "o")
OBJECTIVES = ("pointwise", "listwise")


def default_prompt() -> PromptConfig:
    return PromptConfig(history_window=5, max_review_tokens=32, max_item_tokens=16)


@dataclass(frozen=True)
class LoraConfig:
    rank: int = opt(8, "rank r of each low-rank update B @ A")
    alpha: float = opt(16.0, "scale of the update is alpha / rank")
    targets: str = opt("q,k,v,o", "attention projections adapted (comma-separated of q,k,v,o)")
    first_layer: int = opt(0, "layers below this one are not adapted (backward stops there)")

    @property
    def target_list(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def validate(self) -> None:
        if self.rank < 1 or self.alpha <= 0:
            raise RcllmError("lora.rank must be >= 1 and lora.alpha > 0")
        bad = [t for t in self.target_list if t not in LORA_TARGETS]
        if bad or not self.target_list:
            raise RcllmError(f"lora.targets must name some of q,k,v,o, got {self.targets!r}")
        if self.first_layer < 0:
            raise RcllmError("lora.first_layer must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = opt(720, "optimiser steps (one ranking prompt each)")
    lr: float = opt(1e-3, "peak learning rate (linear warm-up, cosine decay to a tenth)")
    warmup_steps: int = opt(10, "linear warm-up steps")
    weight_decay: float = opt(0.0, "AdamW decoupled weight decay")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0 = off)")
    seed: int = opt(0, "seeds the LoRA init, the example order, negatives and label orders")
    objective: str = opt("pointwise", "pointwise: yes/no log-odds of each candidate after the user "
                                      "side (rcllm.prompt.pointwise), softmax over the "
                                      "candidates; listwise: the verbalizer label of the target")
    reuse: bool = opt(False, "reuse-aware (Block-Attention style, pointwise only): each item "
                             "chunk sees only its template context and itself, as the chunk "
                             "store holds it, while the block tail sees everything; the adapter "
                             "then serves with naive reuse by default")
    reuse_tail: int = opt(0, "with train.reuse: the last k tokens of each item chunk are computed "
                             "in the prompt (they see the user side, as reuse.item_tail=k "
                             "recomputes them at inference) instead of taken from the chunk's "
                             "isolated pass; the adapter then serves with that item tail")
    init: str = opt("", "start from this finished adapter's factors (folder) instead of B = 0: "
                        "a curriculum, e.g. a reuse-aware run warm-started from a standard "
                        "adapter; it must share this run's model, data, user split, prompt and "
                        "LoRA shape (so no held-out user was ever trained on)")
    distill: float = opt(0.0, "with train.reuse and train.init: weight d of distillation from "
                              "the init adapter's full path (the teacher, frozen): loss = "
                              "(1-d)·cross-entropy of the target + d·KL(teacher's candidate "
                              "distribution || this run's reuse path's); 0 = off")
    candidates: int = opt(8, "candidates per training prompt (target + popularity negatives)")
    targets: str = opt("all", "last: each training user's last item; all: every item after "
                               "the first (more, earlier targets)")
    split: str = opt("0.8,0.1,0.1", "train,validation,test fractions of the users")
    split_seed: int = opt(0, "seed of the user split (eval --users test uses the same)")
    checkpoint_every: int = opt(20, "steps between checkpoints (resume restarts from the last)")
    log_every: int = opt(10, "steps per point of the recorded loss curve")

    @property
    def fractions(self) -> tuple[float, ...]:
        try:
            return tuple(float(x) for x in self.split.split(","))
        except ValueError:
            raise RcllmError(f"train.split must be comma-separated fractions, got {self.split!r}")

    def validate(self) -> None:
        if self.steps < 1 or self.lr <= 0 or self.warmup_steps < 0 or self.grad_clip < 0:
            raise RcllmError("need train.steps >= 1, train.lr > 0, warmup_steps >= 0, grad_clip >= 0")
        if self.objective not in OBJECTIVES:
            raise RcllmError(f"train.objective must be one of {', '.join(OBJECTIVES)}, "
                             f"not {self.objective!r}")
        if self.reuse_tail < 0 or (self.reuse_tail and not self.reuse):
            raise RcllmError("train.reuse_tail must be >= 0 and needs train.reuse=true")
        if not 0.0 <= self.distill <= 1.0:
            raise RcllmError(f"train.distill must be within 0..1, got {self.distill}")
        if self.distill and not (self.reuse and self.init):
            raise RcllmError("train.distill needs train.reuse=true and train.init=ADAPTER "
                             "(the teacher is the init adapter's full path)")
        if self.reuse and self.objective != "pointwise":
            raise RcllmError("train.reuse needs train.objective=pointwise")
        if not 2 <= self.candidates <= 26:
            raise RcllmError("train.candidates must be within 2..26")
        if self.targets not in ("last", "all"):
            raise RcllmError(f"train.targets must be 'last' or 'all', not {self.targets!r}")
        if len(self.fractions) != 3:
            raise RcllmError("train.split needs three fractions: train,validation,test")
        if self.checkpoint_every < 1 or self.log_every < 1:
            raise RcllmError("train.checkpoint_every and train.log_every must be >= 1")


@dataclass(frozen=True)
class FinetuneConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    prompt: PromptConfig = field(default_factory=default_prompt)
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        self.model.validate()
        self.prompt.validate()
        self.lora.validate()
        self.train.validate()
        if self.model.adapter:
            raise RcllmError("model.adapter is set: fine-tuning starts from the base weights "
                             "(stacking adapters is not supported)")
        if self.train.candidates > self.prompt.max_candidates:
            raise RcllmError("train.candidates exceeds prompt.max_candidates")

    def key_fields(self) -> dict:
        """The options that change the trained weights: the cache key is built from these
        (thread count, cache folder and logging cadence are left out)."""
        tree = dataclasses.asdict(self)
        for name in ("threads", "cache_dir", "adapter"):
            tree["model"].pop(name)
        for name in ("checkpoint_every", "log_every"):
            tree["train"].pop(name)
        if not self.train.distill:  # absent when off: keys of runs before the option hold
            tree["train"].pop("distill")
        if self.train.init:  # the starting factors by content, not by where they lie
            from .adapter import read_manifest

            tree["train"]["init"] = read_manifest(self.train.init)["sha256"]
        return tree
