"""A user prefix's KV in memory: float (`PrefixKV`) or as stored in the cache (`StoredKV`).

Keys are pre-RoPE (the `Transformer` convention), so a stored prefix is rotated to positions
0..N-1 when attended and can be extended by an append without touching the old slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kvstore.int8 import dequantize, quantize_per_channel


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class PrefixKV:
    """k, v: [L, H_kv, N, D] of the user side (keys pre-RoPE)."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def tokens(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return _nbytes(self.k, self.v)


@dataclass(frozen=True)
class StoredKV:
    """A prefix as held by the cache: float tensors, or INT8 values with per-channel scales
    (`k_scale`/`v_scale` [L, H_kv, 1, D] float32, None for a float entry)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @staticmethod
    def of(kv: PrefixKV, int8: bool) -> "StoredKV":
        if not int8:
            return StoredKV(kv.k, kv.v)
        kq, ks = quantize_per_channel(kv.k)
        vq, vs = quantize_per_channel(kv.v)
        return StoredKV(kq, vq, ks, vs)

    @property
    def is_int8(self) -> bool:
        return self.k_scale is not None

    @property
    def nbytes(self) -> int:
        extra = (self.k_scale, self.v_scale) if self.is_int8 else ()
        return _nbytes(self.k, self.v, *extra)  # type: ignore[arg-type]

    def load(self, dtype: torch.dtype, device: torch.device | str) -> PrefixKV:
        """The float prefix (dequantised for INT8) on `device`; a float entry is not copied
        when it already lives there in `dtype`."""
        if not self.is_int8:
            return PrefixKV(self.k.to(device=device, dtype=dtype),
                            self.v.to(device=device, dtype=dtype))
        assert self.k_scale is not None and self.v_scale is not None
        return PrefixKV(dequantize(self.k, self.k_scale, dtype).to(device),
                        dequantize(self.v, self.v_scale, dtype).to(device))

    def to(self, device: torch.device | str) -> "StoredKV":
        move = (lambda t: None if t is None else t.to(device))
        return StoredKV(move(self.k), move(self.v), move(self.k_scale), move(self.v_scale))
