"""Per-token embeddings that carry meaning and position, for matching review tokens to prototypes.

A token's embedding is its hidden state after the model's first layer (the token and its
local context, as the model sees it), standardised per dimension with corpus statistics (the
raw states are dominated by a few huge dimensions that every token shares, which would make
every pair look alike), then L2-normalised, concatenated with a code of its offset inside its
review chunk:

    e = [sqrt(1 - w) * h_std / |h_std| ,  sqrt(w) * p(offset)]

with |p| = 1, so cos(e1, e2) = (1 - w) cos(h1, h2) + w cos(p1, p2). The offset code works on
log(1 + offset): a chunk's first tokens (built as attention sinks) are told apart sharply,
tokens deep in a review barely by position. With w = 0.1 a pair at far-apart offsets cannot
reach cosine 0.9 unless their states agree almost exactly.
"""

from __future__ import annotations

import math

import torch

from ..model.transformer import Transformer

POSITION_DIMS = 16


def position_code(offsets: torch.Tensor) -> torch.Tensor:
    """[n] chunk offsets → [n, POSITION_DIMS] unit vectors (sin/cos of log(1 + offset))."""
    half = POSITION_DIMS // 2
    freqs = torch.logspace(math.log10(0.5), math.log10(8.0), half, dtype=torch.float32)
    angle = torch.log1p(offsets.to(torch.float32)).unsqueeze(1) * freqs
    return torch.cat((angle.sin(), angle.cos()), dim=1) / math.sqrt(half)


@torch.inference_mode()
def first_layer_states(model: Transformer, ids: torch.Tensor,
                       context: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Hidden states [n, d] after layer 0 of chunk tokens `ids` [n] placed after `context`
    (its layer-0 K/V [H_kv, P, D], pre-RoPE), exactly as the chunk's KV is built."""
    past = 0 if context is None else context[0].shape[1]
    n = ids.shape[0]
    positions = torch.arange(past, past + n, device=ids.device)
    all_pos = torch.arange(past + n, device=ids.device)
    return model.layer_after(0, model.embed(ids), positions, all_pos,
                             *(context if context is not None else (None, None)))[0]


def embed_tokens(states: torch.Tensor, offsets: torch.Tensor, mean: torch.Tensor,
                 std: torch.Tensor, position_weight: float) -> torch.Tensor:
    """States [n, d] + offsets [n] → unit embeddings [n, d + POSITION_DIMS] (float32)."""
    z = (states.to(torch.float32) - mean) / std
    z = z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)
    p = position_code(offsets)
    return torch.cat((math.sqrt(1.0 - position_weight) * z, math.sqrt(position_weight) * p), 1)
