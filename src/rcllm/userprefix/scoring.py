"""Scoring C candidates after one user prefix: one batched pass vs C independent forwards.

The batched pass flattens every candidate's suffix tokens into one sequence at positions
N, N+1, ... (each suffix restarts at N: all candidates sit right after the user side). Every
linear layer runs once over all C suffixes together; attention gives each suffix token the
whole prefix plus its own suffix causally (a block mask) and never another candidate. The
attention runs in groups of whole candidates (at most `GROUP_TOKENS` query tokens) so the
masked-out cross-candidate rectangle is not computed for all pairs at once.

The readout is TALLRec's: P(" Yes") from the two-way softmax over the " Yes" / " No" logits
at each suffix's last token; only those two rows of the LM head are evaluated.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..model.transformer import Transformer
from .kv import PrefixKV

GROUP_TOKENS = 1024


@torch.inference_mode()
def compute_prefix(model: Transformer, ids: Sequence[int]) -> PrefixKV:
    """The user side's KV from one causal forward (positions 0..N-1)."""
    out = model.forward(torch.tensor(list(ids), device=model.device), return_kv=True)
    return PrefixKV(out["k"], out["v"])


def _groups(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """Token ranges [start, end) of consecutive whole candidates, ≤ GROUP_TOKENS each
    (a longer single candidate forms its own group)."""
    out, start, end = [], 0, 0
    for n in lengths:
        if end > start and end - start + n > GROUP_TOKENS:
            out.append((start, end))
            start = end
        end += n
    if end > start:
        out.append((start, end))
    return out


def suffix_last_hidden(model: Transformer, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
                       suffixes: Sequence[Sequence[int]]) -> torch.Tensor:
    """The last hidden state (before the final norm) of every suffix [C, d], each suffix
    placed right after the prefix (keys pre-RoPE, [L, H_kv, N, D]) and seeing only it and
    itself. No inference mode: fine-tuning backpropagates through it (and through the prefix
    KV when that carries a graph). Raises ValueError for an empty suffix."""
    if any(len(s) == 0 for s in suffixes):
        raise ValueError("empty candidate suffix")
    dev, n = model.device, prefix_k.shape[2]
    lengths = [len(s) for s in suffixes]
    ids = torch.tensor([t for s in suffixes for t in s], device=dev)          # [m]
    pos = torch.cat([torch.arange(n, n + k, device=dev) for k in lengths])   # [m]
    owner = torch.repeat_interleave(torch.arange(len(lengths), device=dev),
                                    torch.tensor(lengths, device=dev))       # [m]
    last = torch.tensor(lengths, device=dev).cumsum(0) - 1                   # [C]
    groups = _groups(lengths)
    masks = []
    for a, b in groups:  # [g, n + g]: the whole prefix, then own-candidate causal
        own = (owner[a:b, None] == owner[None, a:b]) & (pos[None, a:b] <= pos[a:b, None])
        masks.append(torch.cat((torch.ones(b - a, n, dtype=torch.bool, device=dev), own), 1))
    gqa = model.arch.num_heads != model.arch.num_kv_heads
    prefix_pos = torch.arange(n, device=dev)
    h = model.embed(ids)                                                     # [m, d]
    for layer in range(model.arch.num_layers):
        q, k, v = model.qkv(layer, h)                                        # [H, m, D]
        q, k = model.rope(q, pos), model.rope(k, pos)
        pk = model.rope(prefix_k[layer], prefix_pos)                         # [H_kv, n, D]
        pv = prefix_v[layer]
        attn = torch.empty_like(q)
        for (a, b), mask in zip(groups, masks):
            keys = torch.cat((pk, k[:, a:b]), dim=1)
            vals = torch.cat((pv, v[:, a:b]), dim=1)
            attn[:, a:b] = F.scaled_dot_product_attention(
                q[:, a:b].unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0), attn_mask=mask,
                enable_gqa=gqa).squeeze(0)
        h = model.finish(layer, h, attn)
    return h[last]


def yes_no_logits(model: Transformer, h_last: torch.Tensor, yes_id: int, no_id: int
                  ) -> torch.Tensor:
    """Last hidden states [C, d] (before the final norm) → the (yes, no) logits [C, 2]."""
    return F.linear(model.final_hidden(h_last), model.lm_head[[yes_id, no_id]]).float()


@torch.inference_mode()
def score_batched(model: Transformer, prefix: PrefixKV, suffixes: Sequence[Sequence[int]],
                  yes_id: int, no_id: int) -> torch.Tensor:
    """P(yes) per candidate [C] (float32, CPU) in one pass over the cached prefix.

    The prefix is not modified. Raises ValueError for an empty suffix.
    """
    h = suffix_last_hidden(model, prefix.k, prefix.v, suffixes)
    return torch.softmax(yes_no_logits(model, h, yes_id, no_id), dim=-1)[:, 0].cpu()


@torch.inference_mode()
def score_independent(model: Transformer, prefix_ids: Sequence[int], suffix: Sequence[int],
                      yes_id: int, no_id: int) -> float:
    """The reference: P(yes) from one full forward over prefix + suffix (no cache)."""
    ids = torch.tensor(list(prefix_ids) + list(suffix), device=model.device)
    out = model.forward(ids, return_hidden=True)
    return float(_yes_prob_from_normed(model, out["hidden"], yes_id, no_id))


def _yes_prob_from_normed(model: Transformer, normed: torch.Tensor, yes_id: int,
                          no_id: int) -> torch.Tensor:
    logits = F.linear(normed, model.lm_head[[yes_id, no_id]]).float()
    return torch.softmax(logits, dim=-1)[0]
