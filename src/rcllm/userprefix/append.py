"""Incremental append: extend a cached user prefix with new behaviour without recomputing it.

The new tokens run as a forward *with past* (the cached KV at positions 0..N-1, the new tokens
at N..N+n-1) and their KV is concatenated after the old slots. With exact float attention over
an exact past, this equals a fresh compute of the whole prefix up to float rounding; with an
INT8 past the new tokens see dequantised keys, so error accumulates append after append — the
reason the ranker recomputes the prefix in full every `refresh_every` appends.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..model.transformer import Transformer
from .kv import PrefixKV


@torch.inference_mode()
def append_prefix(model: Transformer, prefix: PrefixKV, new_ids: Sequence[int]) -> PrefixKV:
    """A new PrefixKV = prefix + new_ids; `prefix` is not modified. No new ids → prefix."""
    if not new_ids:
        return prefix
    out = model.forward(torch.tensor(list(new_ids), device=model.device),
                        past_k=prefix.k, past_v=prefix.v, return_kv=True)
    return PrefixKV(torch.cat((prefix.k, out["k"]), dim=2), torch.cat((prefix.v, out["v"]), dim=2))


def kv_drift(a: PrefixKV, b: PrefixKV) -> dict[str, float]:
    """Max absolute and relative (Frobenius) difference of K and V between two prefixes of
    the same length; raises ValueError when the shapes differ."""
    if a.k.shape != b.k.shape:
        raise ValueError(f"prefix shapes differ: {tuple(a.k.shape)} vs {tuple(b.k.shape)}")
    out = {}
    for name, x, y in (("k", a.k, b.k), ("v", a.v, b.v)):
        diff = (x.float() - y.float())
        out[f"{name}_max_abs"] = float(diff.abs().max()) if diff.numel() else 0.0
        norm = float(torch.linalg.vector_norm(y.float()))
        out[f"{name}_rel"] = float(torch.linalg.vector_norm(diff)) / norm if norm else 0.0
    return out
