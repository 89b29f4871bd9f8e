"""Shared test helpers for the KV store tests (imported by name: tests/ is not a package)."""

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
