"""Shared test helpers for the KV store tests (imported by name: tests/ is not a package)."""

import dataclasses
import json

import torch

from rcllm.kvstore.base import ChunkKV, chunk_key
from rcllm.kvstore.codec import KeyCheck

FP = "model-fp-1"


def make_entry(seed: int, num_tokens: int = 8, layers: int = 3, heads: int = 2, dim: int = 4):
    """A (key, ChunkKV) pair whose key is chunk_key(FP, "item", token ids)."""
    g = torch.Generator().manual_seed(seed)
    ids = tuple(int(x) for x in torch.randint(0, 50_000, (num_tokens,), generator=g))
    kv = ChunkKV(ids, torch.randn(layers, heads, num_tokens, dim, generator=g),
                 torch.randn(layers, heads, num_tokens, dim, generator=g))
    return chunk_key(FP, "item", ids), kv


def same(a: ChunkKV, b: ChunkKV) -> bool:
    return a.token_ids == b.token_ids and torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def write_adapter(folder, loaded, model_dir, scale=0.5, alpha=1.0, rank=2, **manifest):
    """A small valid rcllm adapter for `loaded` (layer 0's o_proj) saved in `folder`."""
    from rcllm.config import PROMPT_VERSION, PromptConfig
    from rcllm.finetune.adapter import save_adapter

    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    g = torch.Generator().manual_seed(0)
    name = "model.layers.0.self_attn.o_proj"
    factors = {name + ".lora_A": torch.randn(rank, hidden, generator=g),
               name + ".lora_B": torch.randn(hidden, rank, generator=g)}
    save_adapter(folder, factors, {"base_fingerprint": loaded.fingerprint, "rank": rank,
                                   "alpha": alpha, "scale": scale, "targets": ["o"],
                                   "first_layer": 0,
                                   "prompt": dataclasses.asdict(PromptConfig()),
                                   "split": {"fractions": [0.8, 0.1, 0.1], "seed": 0},
                                   "prompt_version": PROMPT_VERSION, **manifest})
    return folder
