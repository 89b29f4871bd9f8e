"""Synthetic users with long histories, for the benchmark and the tests.

The built-in synthetic dataset gives users 3–40 reviews; the benchmark needs a ~1500-token
user side, so `long_history` cycles a user's reviews (later timestamps, same texts) until the
prefix reaches the target. Deterministic for a given seed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..config import PromptConfig
from ..eval.datasets import load_dataset
from ..model.loading import LoadedModel
from ..prompt.builder import PromptBuilder
from ..prompt.pointwise import PointwisePrompt
from ..records import Dataset, HistoryEntry, ItemId

DAY_S = 86_400


def synthetic_dataset(seed: int = 0, num_users: int = 40, num_items: int = 200) -> Dataset:
    return load_dataset("", "synthetic", num_users=num_users, num_items=num_items, seed=seed)


def pointwise_prompt(loaded: LoadedModel, dataset: Dataset, max_prefix_tokens: int = 4096
                     ) -> PointwisePrompt:
    builder = PromptBuilder(loaded.tokenizer, dataset.items, PromptConfig(),
                            loaded.model.arch.max_positions)
    return PointwisePrompt(builder, max_prefix_tokens)


def long_history(prompt: PointwisePrompt, base: list[HistoryEntry], target_tokens: int
                 ) -> list[HistoryEntry]:
    """`base` cycled (timestamps moved on a day per entry) until the user side reaches
    `target_tokens`; never exceeds it by more than one entry."""
    out: list[HistoryEntry] = []
    tokens = len(prompt.user_side("probe", []).ids)  # type: ignore[arg-type]
    t = base[0].timestamp
    i = 0
    while tokens < target_tokens:
        entry = replace(base[i % len(base)], timestamp=t)
        tokens += len(prompt.history_ids([entry]))
        out.append(entry)
        t += DAY_S
        i += 1
    return out


def sample_candidates(dataset: Dataset, count: int, seed: int) -> list[ItemId]:
    rng = np.random.default_rng(seed)
    ids = sorted(dataset.items)
    return [ids[i] for i in rng.choice(len(ids), size=min(count, len(ids)), replace=False)]
