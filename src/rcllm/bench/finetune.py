"""Training throughput: prompts per second of `rcllm finetune`'s optimiser steps, per variant
(threads, first adapted layer, whether item chunks' states are kept), on the same training
prompts, as ratios against the first variant measured in the same run (`rcllm bench finetune`).

Each variant builds the trainer of the given options, takes one warm-up step (prompt 0), then
times `prompts` steps of one prompt each (prompts 1..N: forward and backward on the configured
path(s), the optimiser update) — the *first* pass, where the frozen layers' outputs are computed
and recorded — and then the same N prompts *again*, where a variant with `lora.first_layer` > 0
starts at that layer (what every epoch after the first and every validation after the first
does). Every variant sees the same prompts. A variant that keeps item chunks' states
(`train.item_cache`, the default) computes them for the timed prompts' candidates before the
first pass: the first pass then runs as an epoch's prompts do once their items have appeared in
an earlier prompt (`epoch_item_share`: the share of an epoch's candidate look-ups that do, from
the training stream alone). That the kept states give the same scores and gradients is pinned
by tests/finetune/test_ft_frozen.py and test_ft_itemstates.py, not timed here.
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from dataclasses import dataclass

from ..errors import RcllmError


@dataclass(frozen=True)
class Variant:
    threads: int
    first_layer: int
    item_cache: bool = True

    @classmethod
    def parse(cls, text: str) -> "Variant":
        parts = text.split(":")
        whole = len(parts) == 3 and parts[2] == "whole"
        try:
            if len(parts) not in (2, 3) or (len(parts) == 3 and not whole):
                raise ValueError
            threads, first = (int(x) for x in parts[:2])
        except ValueError:
            raise RcllmError(f"a variant is THREADS:FIRST_LAYER[:whole] (e.g. 2:20 or "
                             f"2:20:whole), not {text!r}") from None
        if threads < 1 or first < 0:
            raise RcllmError(f"variant {text!r}: threads >= 1 and first layer >= 0")
        return cls(threads, first, not whole)

    @property
    def label(self) -> str:
        return (f"{self.threads} thread{'s' if self.threads > 1 else ''}, LoRA from layer "
                f"{self.first_layer}" + ("" if self.item_cache else ", chunk pass whole"))


def epoch_item_share(stream) -> float:
    """Share of one epoch's candidate look-ups whose item an earlier prompt of it held."""
    seen: set = set()
    hit = total = 0
    for i in range(len(stream)):
        for c in stream.draw(i).candidates:
            hit += c in seen
            total += 1
            seen.add(c)
    return hit / max(1, total)


def measure(ds, variant: Variant, prompts: int, overrides: list[str], config: str | None = None
            ) -> dict:
    """Times one variant (see the module docstring); returns its row."""
    from ..config import load
    from ..eval.protocol import split_users
    from ..finetune.config import FinetuneConfig
    from ..finetune.lora import LoraPatch
    from ..finetune.trainer import Trainer
    from ..model.loading import load_model

    cfg = load(FinetuneConfig, config, [*overrides, f"model.threads={variant.threads}",
                                        f"lora.first_layer={variant.first_layer}",
                                        f"train.item_cache={variant.item_cache}",
                                        "train.batch=1", "train.val_users=0",
                                        f"train.steps={2 * prompts + 2}"])
    train_users = split_users(ds, cfg.train.fractions, cfg.train.split_seed)[0]
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(load_model(cfg.model), ds, train_users, cfg, pathlib.Path(tmp), "bench")
        patch = LoraPatch(t.model, t.lora, t._base)
        try:
            t._step(patch, 0)   # warm-up: allocator, kernels
            held = 0    # the timed prompts' items, as an epoch finds them once seen
            for s in range(1, prompts + 1) if t.scorer is not None else ():
                held = t.scorer.warm_items(t.stream.draw(s).candidates)
            row = {"variant": variant.label, "threads": variant.threads,
                   "first_layer": variant.first_layer, "item_cache": variant.item_cache,
                   "path": cfg.train.path, "prompts": prompts, "items_held": held,
                   "epoch_item_share": epoch_item_share(t.stream)}
            # with nothing cached (LoRA from layer 0, or no cache) the second pass is the first
            cached = variant.first_layer > 0 and cfg.train.frozen_cache_gb > 0
            for name in ("first", "again") if cached else ("first",):
                start = time.perf_counter()
                for s in range(1, prompts + 1):
                    t._step(patch, s)
                row[f"{name}_per_s"] = prompts / (time.perf_counter() - start)
        finally:
            patch.restore()
    row["cached"] = cached
    row.setdefault("again_per_s", row["first_per_s"])
    return row


def table(rows: list[dict], epochs: float) -> tuple[list[str], dict]:
    """Markdown lines with ratios against the first row, and the summary; adds `mean_per_s`
    and `speedup` to each row. `epochs`: the run length the mean rate assumes (the first
    epoch computes every prompt whole, the others start at the first adapted layer)."""
    again = max(0.0, epochs - 1)
    for r in rows:
        r["mean_per_s"] = epochs / (min(epochs, 1) / r["first_per_s"] + again / r["again_per_s"])
    lines = ["| variant | first pass prompts/s | cached pass prompts/s | "
             f"mean over {epochs:g} epochs | × first row |", "|---|---|---|---|---|"]
    for r in rows:
        r["speedup"] = r["mean_per_s"] / rows[0]["mean_per_s"]
        lines.append(f"| {r['variant']} | {r['first_per_s']:.3f} | {r['again_per_s']:.3f} | "
                     f"{r['mean_per_s']:.3f} | {r['speedup']:.2f} |")
    return lines, {"baseline": rows[0]["variant"], "best_speedup": max(r["speedup"] for r in rows)}
