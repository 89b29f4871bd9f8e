"""Turning a prefilled prompt into candidate scores.

- verbalizer (LlamaRec): log-softmax over the candidate label tokens at the last position.
- likelihood: mean log-probability of each candidate's name as the continuation of the
  prompt. All continuations run in one batched pass over the shared prompt KV: each
  continuation token attends to every prompt token and causally to its own continuation
  only (a block mask), never to the other candidates.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..model.transformer import Transformer


def verbalizer_scores(logits: torch.Tensor, label_ids: Sequence[int]) -> torch.Tensor:
    return torch.log_softmax(logits[list(label_ids)], dim=-1)


@torch.inference_mode()
def continuation_scores(model: Transformer, k_buf: torch.Tensor, v_buf: torch.Tensor,
                        last_logits: torch.Tensor, continuations: Sequence[Sequence[int]]
                        ) -> torch.Tensor:
    """Mean log p(continuation | prompt) per candidate: [C].

    k_buf/v_buf: [L, H_kv, N, D] the prompt's KV (pre-RoPE keys); last_logits: [V] at N-1.
    """
    if any(len(c) == 0 for c in continuations):
        raise ValueError("empty continuation")
    n = k_buf.shape[2]
    first = torch.log_softmax(last_logits, dim=-1)
    inputs, pos, owner, targets = [], [], [], []
    for ci, cont in enumerate(continuations):
        for j in range(len(cont) - 1):
            inputs.append(cont[j])
            pos.append(n + j)
            owner.append(ci)
            targets.append(cont[j + 1])
    total = torch.tensor([float(first[c[0]]) for c in continuations])
    if inputs:
        dev = k_buf.device
        ids = torch.tensor(inputs, device=dev)
        pos_t = torch.tensor(pos, device=dev)
        own = torch.tensor(owner, device=dev)
        m = len(inputs)
        # [m, n + m]: every prompt key, plus own-continuation keys at or before the query
        own_mask = (own.unsqueeze(0) == own.unsqueeze(1)) & (
            pos_t.unsqueeze(0) <= pos_t.unsqueeze(1))
        mask = torch.cat((torch.ones(m, n, dtype=torch.bool, device=dev), own_mask), dim=1)
        prompt_pos = torch.arange(n, device=dev)
        gqa = model.arch.num_heads != model.arch.num_kv_heads
        h = model.embed(ids)
        for layer in range(model.arch.num_layers):
            q, k, v = model.qkv(layer, h)
            keys = torch.cat((model.rope(k_buf[layer], prompt_pos), model.rope(k, pos_t)), dim=1)
            vals = torch.cat((v_buf[layer], v), dim=1)
            attn = F.scaled_dot_product_attention(
                model.rope(q, pos_t).unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0),
                attn_mask=mask, enable_gqa=gqa).squeeze(0)
            h = model.finish(layer, h, attn)
        logp = torch.log_softmax(model.logits(h), dim=-1)
        tok_lp = logp[torch.arange(m), torch.tensor(targets)]
        total = total.index_add(0, own.cpu(), tok_lp.float().cpu())
    lengths = torch.tensor([float(len(c)) for c in continuations])
    return total / lengths
