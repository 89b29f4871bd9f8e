"""Options of `rcllm finetune` as frozen dataclasses (loaded like RcllmConfig: YAML + --set).

The prompt defaults are shorter than the engine's (5 reviews of at most 32 tokens, enough for
the review's date, rating and item title; item texts of at most 16 tokens) to keep a training
prompt cheap on a CPU (docs/finetune.md gives the cost per dataset). The adapter records its prompt settings and objective, and
`rcllm eval --adapter` adopts them, so a ranker is evaluated on the prompts it was trained on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..config import ModelConfig, PromptConfig, opt
from ..errors import RcllmError

LORA_TARGETS = ("q", "k", "v", "o")
OBJECTIVES = ("pointwise", "listwise")
PATHS = ("joint", "full", "reuse")


def default_prompt() -> PromptConfig:
    return PromptConfig(history_window=5, max_review_tokens=32, max_item_tokens=16)


@dataclass(frozen=True)
class LoraConfig:
    rank: int = opt(8, "rank r of each low-rank update B @ A")
    alpha: float = opt(16.0, "scale of the update is alpha / rank")
    targets: str = opt("q,k,v,o", "attention projections adapted (comma-separated of q,k,v,o)")
    first_layer: int = opt(20, "layers below this one are not adapted: backward stops there, "
                               "and their outputs are computed once per prompt "
                               "(train.frozen_cache_gb)")

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
    path: str = opt("joint", "joint: every prompt is scored on the full path and on the reuse "
                             "path (item chunks as the chunk store holds them, the item tail "
                             "computed), on shared weights; loss = cross-entropy of the target "
                             "on both + train.match · KL(full || reuse) over the candidates. "
                             "full: the full path only. reuse: the reuse path only (the former "
                             "train.reuse=true). The adapter records the fast path it was "
                             "trained for (naive, item tail k) and serves with it")
    reuse_tail: int = opt(1, "joint/reuse: the last k tokens of each item chunk are computed in "
                             "the prompt (they see the user side, as reuse.item_tail=k does at "
                             "inference) instead of taken from the chunk's isolated pass")
    reuse_select: str = opt("overlap", "joint/reuse: which reused item tokens the reuse path "
                                       "computes in the prompt besides the tail. overlap (the "
                                       "default): the engine's rcllm method with "
                                       "reuse.rcllm_select=overlap at train.reuse_ratio (item "
                                       "tokens in runs of >= 3 tokens shared with the history "
                                       "first), so the adapter learns to use the tokens serving "
                                       "recomputes; naive: none (the engine's naive method). "
                                       "overlap trained a better full path and fast paths that "
                                       "read the user on Magazine and Gift Cards "
                                       "(docs/finetune.md); late: the engine's late method at "
                                       "train.late_layer (the item chunks' KV from the store "
                                       "below it, every item token computed from it up)")
    late_layer: int = opt(20, "reuse_select=late: the layer s from which the reuse path "
                              "computes every item token against the user (reuse.late_layer). "
                              "With lora.first_layer >= s the layers below s are never trained "
                              "and the chunk pass needs no gradient; with lora.first_layer < s "
                              "(DeFormer: every layer tuned, e.g. lora.first_layer=0) the "
                              "chunk's isolated pass is trained too, from lora.first_layer up "
                              "to s, and the engine serves the chunk KV of the merged adapter")
    late_distill: float = opt(0.0, "joint, reuse_select=late: weight of the distillation of "
                                   "the item tokens above the join: their K and V on the reuse "
                                   "path matched to the full path's (no gradient) at every "
                                   "trained layer from late_layer up, squared error over the "
                                   "full path's squared norm, averaged over layers (what the "
                                   "answer reads of an item; DeFormer's upper-layer "
                                   "distillation)")
    reuse_ratio: float = opt(0.15, "reuse_select=overlap: the share of each prompt's reused "
                                   "item tokens recomputed (reuse.item_ratio)")
    reuse_fill: str = opt("order", "reuse_select=overlap: where the budget left after the "
                                   "shared runs goes (reuse.overlap_fill: order or ends)")
    match: float = opt(1.0, "joint: weight of KL(full's candidate distribution, no gradient || "
                            "the reuse path's): a dense target that asks the fast path to rank "
                            "as the full path does")
    hidden_match: float = opt(0.0, "joint: weight of the MSE of the answer slots' final-normed "
                                   "hidden states, reuse vs full (full without gradient)")
    epochs: float = opt(1.0, "passes over the training examples (with train.steps=0); one "
                            "epoch of one prompt per step reached on Magazine the full-path "
                            "NDCG@10 that four epochs of eight per step reached (finetune.md)")
    batch: int = opt(1, "prompts per optimiser step (gradients accumulated, loss averaged); "
                        "1 learns fastest per prompt (docs/finetune.md, Ablation)")
    steps: int = opt(0, "optimiser steps; 0 = epochs x examples / batch")
    lr: float = opt(1e-3, "peak learning rate (linear warm-up, cosine decay to a tenth)")
    warmup_steps: int = opt(10, "linear warm-up steps (at most a tenth of the run)")
    weight_decay: float = opt(0.0, "AdamW decoupled weight decay")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0 = off)")
    seed: int = opt(0, "seeds the LoRA init, the example order, negatives and label orders")
    objective: str = opt("pointwise", "pointwise: yes/no log-odds of each candidate after the user "
                                      "side (rcllm.prompt.pointwise), softmax over the "
                                      "candidates; listwise: the verbalizer label of the target "
                                      "(train.path=full only)")
    init: str = opt("", "start from this finished adapter's factors (folder) instead of B = 0; "
                        "it must share this run's model, data, user split, prompt and LoRA "
                        "shape (so no held-out user was ever trained on)")
    distill: float = opt(0.0, "with train.path=reuse and train.init: weight d of distillation "
                              "from the init adapter's full path (frozen): loss = (1-d)·CE + "
                              "d·KL(teacher || reuse path); superseded by train.path=joint")
    candidates: int = opt(8, "candidates per training prompt (target + popularity negatives)")
    negatives: str = opt("fixed", "fixed: an example's negatives are drawn once (seeded by the "
                                  "example), so its prompt is the same every epoch and the "
                                  "frozen layers' outputs are reused (lora.first_layer > 0); "
                                  "fresh: new negatives every time it is drawn")
    frozen_cache_gb: float = opt(6.0, "memory for the frozen layers' outputs per prompt "
                                      "(training and validation prompts; exact); 0 = off")
    item_cache: bool = opt(True, "keep the reuse path's chunk pass below the first adapted "
                                 "(or the late) layer per item chunk, in frozen_cache_gb, so "
                                 "a prompt computes it only for items no earlier prompt held "
                                 "(exact)")
    targets: str = opt("all", "last: each training user's last item; all: every item after "
                               "the first (more, earlier targets)")
    max_examples: int = opt(2048, "most training examples (0 = all): beyond it each user's "
                                  "latest targets are kept, round-robin over the users, so one "
                                  "default run ends in about 2 h here (MovieLens 100K has 79,263 "
                                  "examples: 2 epochs would take days)")
    val_users: int = opt(64, "validation users scored at each validation (0 = no validation: "
                             "the last step's weights are kept)")
    val_candidates: int = opt(20, "candidates per validation prompt (the evaluation's cases)")
    choice_targets: int = opt(4, "requests per validation user the end-of-run fast-path "
                                 "choice scores: the user's last k targets (each with the "
                                 "history before it), so the choice resolves ~2x smaller "
                                 "differences than one request per user; changes no weights")
    choice: str = opt("sequential", "how the end-of-run fast-path choice scores its paths: "
                                    "sequential (what the paths share computed once, a path "
                                    "dropped once it cannot keep the ranking; names what "
                                    "exhaustive names) or exhaustive (every path in its own "
                                    "pass on every request); changes no weights")
    val_every: int = opt(0, "steps between validations; 0 = four times per epoch")
    patience: int = opt(3, "stop after this many validations without a lower validation "
                           "cross-entropy (0 = never stop early)")
    split: str = opt("0.8,0.1,0.1", "train,validation,test fractions of the users")
    split_seed: int = opt(0, "seed of the user split (eval --users test uses the same)")
    checkpoint_every: int = opt(5, "steps between checkpoints (resume restarts from the last)")
    log_every: int = opt(1, "steps per point of the training curve")

    @property
    def fractions(self) -> tuple[float, ...]:
        try:
            return tuple(float(x) for x in self.split.split(","))
        except ValueError:
            raise RcllmError(f"train.split must be comma-separated fractions, got {self.split!r}")

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths each prompt is scored on."""
        return {"joint": ("full", "reuse"), "full": ("full",), "reuse": ("reuse",)}[self.path]

    def validate(self) -> None:
        if (self.steps < 0 or self.epochs <= 0 or self.batch < 1 or self.lr <= 0
                or self.warmup_steps < 0 or self.grad_clip < 0 or self.max_examples < 0):
            raise RcllmError("need train.steps >= 0, train.epochs > 0, train.batch >= 1, "
                             "train.lr > 0, warmup_steps >= 0, grad_clip >= 0, "
                             "max_examples >= 0")
        if self.path not in PATHS:
            raise RcllmError(f"train.path must be one of {', '.join(PATHS)}, not {self.path!r}")
        if self.objective not in OBJECTIVES:
            raise RcllmError(f"train.objective must be one of {', '.join(OBJECTIVES)}, "
                             f"not {self.objective!r}")
        if self.objective != "pointwise" and self.path != "full":
            raise RcllmError("train.objective=listwise needs train.path=full")
        if self.reuse_fill not in ("order", "ends"):
            raise RcllmError(f"train.reuse_fill must be 'order' or 'ends', not "
                             f"{self.reuse_fill!r}")
        if self.reuse_select not in ("naive", "overlap", "late") or not (
                0 < self.reuse_ratio <= 1):
            raise RcllmError(f"train.reuse_select must be 'naive', 'overlap' or 'late' (got "
                             f"{self.reuse_select!r}) and train.reuse_ratio within (0, 1]")
        if min(self.reuse_tail, self.match, self.hidden_match, self.late_distill) < 0:
            raise RcllmError("train.reuse_tail, match, hidden_match and late_distill must be "
                             ">= 0")
        if self.late_distill and not (self.path == "joint" and self.reuse_select == "late"):
            raise RcllmError("train.late_distill needs train.path=joint and "
                             "train.reuse_select=late (it matches the reuse path's item K/V "
                             "to the full path's in the same pass)")
        if not 0.0 <= self.distill <= 1.0:
            raise RcllmError(f"train.distill must be within 0..1, got {self.distill}")
        if self.distill and not (self.path == "reuse" and self.init):
            raise RcllmError("train.distill needs train.path=reuse and train.init=ADAPTER "
                             "(the teacher is the init adapter's full path)")
        if not 2 <= self.candidates <= 26 or not 2 <= self.val_candidates <= 26:
            raise RcllmError("train.candidates and train.val_candidates must be within 2..26")
        if self.negatives not in ("fixed", "fresh") or self.frozen_cache_gb < 0:
            raise RcllmError(f"train.negatives must be 'fixed' or 'fresh' (got "
                             f"{self.negatives!r}) and train.frozen_cache_gb >= 0")
        if self.targets not in ("last", "all"):
            raise RcllmError(f"train.targets must be 'last' or 'all', not {self.targets!r}")
        if len(self.fractions) != 3:
            raise RcllmError("train.split needs three fractions: train,validation,test")
        if self.choice_targets < 1 or self.choice not in ("sequential", "exhaustive"):
            raise RcllmError(f"train.choice_targets must be >= 1 and train.choice sequential "
                             f"or exhaustive (got {self.choice_targets}, {self.choice!r})")
        if min(self.val_users, self.val_every, self.patience) < 0:
            raise RcllmError("train.val_users, val_every and patience must be >= 0")
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
        t = self.train
        if t.reuse_select == "late" and t.path != "full" and t.late_layer < 1:
            raise RcllmError(f"train.late_layer={t.late_layer} must be >= 1 (late@0 is the "
                             "full path)")
        if self.train.candidates > self.prompt.max_candidates:
            raise RcllmError("train.candidates exceeds prompt.max_candidates")

    def key_fields(self) -> dict:
        """The options that change the trained weights: the cache key is built from these
        (thread count, cache folder and logging cadence are left out)."""
        tree = dataclasses.asdict(self)
        for name in ("threads", "cache_dir", "adapter"):
            tree["model"].pop(name)
        for name in ("checkpoint_every", "log_every", "frozen_cache_gb", "item_cache",
                     "max_examples", "choice_targets", "choice"):
            tree["train"].pop(name)  # max_examples: run_key adds the count when the cap binds
        t = tree["train"]
        if self.train.path == "full":  # options of the other paths change nothing
            for name in ("reuse_tail", "match", "hidden_match", "reuse_select", "reuse_ratio",
                         "reuse_fill", "late_layer"):
                t.pop(name)
        elif self.train.path == "reuse":
            for name in ("match", "hidden_match"):
                t.pop(name)
        if not self.train.distill:
            t.pop("distill")
        if not self.train.late_distill:   # keys of runs from before the option hold
            t.pop("late_distill")
        if t.get("reuse_select") != "late":   # keys of runs from before the option hold
            t.pop("late_layer", None)
        else:
            for name in ("reuse_ratio", "reuse_fill"):
                t.pop(name)
        if t.get("reuse_select") == "naive":  # keys of runs from before the option hold
            t.pop("reuse_select")
            t.pop("reuse_ratio")
            t.pop("reuse_fill")
        elif t.get("reuse_fill") == "order":  # likewise, from before reuse_fill
            t.pop("reuse_fill")
        if self.train.init:  # the starting factors by content, not by where they lie
            from .adapter import read_manifest

            tree["train"]["init"] = read_manifest(self.train.init)["sha256"]
        return tree
