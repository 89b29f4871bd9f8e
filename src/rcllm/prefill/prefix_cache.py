"""Exact prefix reuse at block granularity (vLLM-style automatic prefix caching).

A prompt's KV is stored in blocks of `block` tokens; block i's key chains the key of block
i-1 with its own token ids, so a hit on block i implies the whole prefix up to it matches.
Only exact KV may be inserted (computed in full from position 0).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..kvstore.base import ChunkKV, KVMatch, MemoryLRUStore, chunk_key


class PrefixCache:
    def __init__(self, fingerprint: str, block: int = 16, capacity_bytes: int = 1 << 30):
        self.fingerprint = fingerprint
        self.block = block
        self.store = MemoryLRUStore(capacity_bytes)

    def _keys(self, ids: Sequence[int], upto: int):
        prev = ""
        for start in range(0, upto - upto % self.block, self.block):
            prev = chunk_key(self.fingerprint, "prefix:" + prev, ids[start:start + self.block])
            yield start, prev

    def match(self, ids: Sequence[int], limit: int) -> KVMatch | None:
        """The longest cached prefix of `ids` (at most `limit` tokens, whole blocks), or None."""
        pieces = []
        for start, key in self._keys(ids, limit):
            entry = self.store.get(key)
            if entry is None:
                break
            pieces.append((start, entry.k, entry.v))
        if not pieces:
            return None
        n = pieces[-1][0] + self.block
        return KVMatch("prefix", 0, n, tuple(pieces), n, exact=True)

    def insert(self, ids: Sequence[int], k: torch.Tensor, v: torch.Tensor, upto: int) -> None:
        """Stores the full blocks of ids[:upto]; k/v [L, H_kv, >=upto, D] must be exact."""
        for start, key in self._keys(ids, upto):
            if not self.store.contains(key):
                end = start + self.block
                self.store.put(key, ChunkKV(tuple(ids[start:end]), k[:, :, start:end].clone(),
                                            v[:, :, start:end].clone()))
