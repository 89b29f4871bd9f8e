"""Selective prefill: reused KV for most tokens, recomputation for the few that matter.

Given N assembled tokens where some slots already hold KV (exact prefix blocks, or reused
chunks computed in another context) and the rest are fresh:

1. Layer 0 runs on every non-exact token when the policy asks for a probe (rcllm,
   cacheblend); its output feeds layer 1's K/V projections, compared with the cached layer-1
   K/V → a *deviation* per reused token; layer-0 attention of the last queries gives the
   attention *mass* each token receives.
2. The policy picks the tokens to recompute; fresh tokens are always computed.
3. Layers ≥ 1 compute only the chosen tokens: their new K/V overwrite the reused ones, their
   queries attend causally over all N keys (reused keys are rotated to their new positions).
4. Only the last position's hidden state is returned (logits are the caller's choice).

With a policy that selects every token this is exactly full recompute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..model.transformer import Transformer
from .selection import Probe, SelectionPolicy

MASS_QUERIES = 16  # last queries whose layer-0 attention defines the heavy hitters


@dataclass
class PrefillInputs:
    ids: torch.Tensor        # [N] token ids
    k_buf: torch.Tensor      # [L, H_kv, N, D] pre-RoPE keys; valid where have_kv
    v_buf: torch.Tensor      # [L, H_kv, N, D]
    have_kv: torch.Tensor    # [N] bool: slot holds cached KV (exact or reused)
    exact_kv: torch.Tensor   # [N] bool: cached KV is exact (prefix blocks): never recomputed
    kind: torch.Tensor       # [N] int8 codes of prompt.builder.KINDS
    offset: torch.Tensor     # [N] int: position inside its chunk (0 for non-chunk tokens)
    # Overlap (engine's reuse.overlap): layer(l) blocks until k_buf[l]/v_buf[l] hold the reused
    # KV and returns layer l's keys already rotated to their positions (the gather thread
    # rotates them while earlier layers compute), or None when nothing was prepared.
    layer: Callable[[int], torch.Tensor | None] | None = None


@dataclass
class PrefillResult:
    hidden_last: torch.Tensor          # [d] last position, before the final norm
    computed: torch.Tensor             # [N] bool: computed at layers >= 1
    layer0_computed: int               # tokens computed at layer 0
    flops: float                       # FLOPs actually done
    full_flops: float                  # FLOPs of a full recompute of the same prompt


def _layer(model: Transformer, layer: int, h: torch.Tensor, idx: torch.Tensor,
           inp: PrefillInputs, k_rot_pos: torch.Tensor, qkv=None) -> torch.Tensor:
    q, k, v = qkv if qkv is not None else model.qkv(layer, h)
    k_rot = inp.layer(layer) if inp.layer is not None else None
    inp.k_buf[layer][:, idx] = k
    inp.v_buf[layer][:, idx] = v
    if k_rot is None:
        k_rot = model.rope(inp.k_buf[layer], k_rot_pos)
    else:  # reused keys arrive rotated; only the recomputed ones are rotated here
        k_rot[:, idx] = model.rope(k, idx)
    attn = model.attend(model.rope(q, idx), idx, k_rot, inp.v_buf[layer])
    return model.finish(layer, h, attn)


def _attention_mass(model: Transformer, q: torch.Tensor, q_pos: torch.Tensor,
                    k_rot: torch.Tensor) -> torch.Tensor:
    """Attention probability mass each key receives from the last queries: [N]."""
    a = model.arch
    qs, ps = q[:, -MASS_QUERIES:], q_pos[-MASS_QUERIES:]
    k = k_rot.repeat_interleave(a.num_heads // a.num_kv_heads, dim=0)   # [H, N, D]
    scores = torch.matmul(qs, k.transpose(1, 2)) * model.scale()      # [H, q, N]
    mask = torch.arange(k.shape[1], device=k.device).unsqueeze(0) > ps.unsqueeze(1)
    scores.masked_fill_(mask, float("-inf"))
    return torch.softmax(scores, dim=-1).sum(dim=(0, 1))


def _count_flops(model: Transformer, n: int, computed: torch.Tensor, l0: torch.Tensor,
                 probe_tokens: int) -> tuple[float, float]:
    a = model.arch
    per_layer_linear = a.params_per_token_flops() / a.num_layers
    pos = torch.nonzero(computed).squeeze(1)
    pos0 = torch.nonzero(l0).squeeze(1)
    pairs = float((pos + 1).sum())
    pairs0 = float((pos0 + 1).sum())
    per_layer_attn = a.attention_flops(1) / a.num_layers
    qkv_linear = 2 * a.hidden_size * (a.num_heads + 2 * a.num_kv_heads) * a.head_dim
    head = 2 * a.hidden_size * a.vocab_size
    done = (per_layer_linear * (len(pos0) + (a.num_layers - 1) * len(pos))
            + per_layer_attn * (pairs0 + (a.num_layers - 1) * pairs)
            + qkv_linear * probe_tokens + head)
    full = a.params_per_token_flops() * n + a.attention_flops(n * (n + 1) // 2) + head
    return done, full


@torch.inference_mode()
def prefill(model: Transformer, inp: PrefillInputs, policy: SelectionPolicy) -> PrefillResult:
    """Runs the selective prefill; mutates inp.k_buf/v_buf into the prompt's final KV."""
    n = inp.ids.shape[0]
    if n == 0:
        raise ValueError("empty prompt")
    pos_all = torch.arange(n, device=inp.ids.device)
    fresh = ~inp.have_kv
    probe = policy.needs_probe and bool((inp.have_kv & ~inp.exact_kv).any())
    layer0 = ~inp.exact_kv if probe else (fresh | policy.static_set(inp))
    idx = torch.nonzero(layer0).squeeze(1)
    if int(idx[-1]) != n - 1:
        raise ValueError("the last token must be fresh (it produces the output)")
    h = model.embed(inp.ids[idx])
    for layer in (0, 1) if inp.layer is not None else ():
        inp.layer(layer)  # the probe reads layers 0 and 1 whole (unrotated copies suffice)
    q, k, v = model.qkv(0, h)
    inp.k_buf[0][:, idx] = k
    inp.v_buf[0][:, idx] = v
    k_rot = model.rope(inp.k_buf[0], pos_all)
    q_rot = model.rope(q, idx)
    attn = model.attend(q_rot, idx, k_rot, inp.v_buf[0])
    mass = _attention_mass(model, q_rot, idx, k_rot) if probe and 0 in policy.mass_layers() else None
    h = model.finish(0, h, attn)
    start, qkv1, probe_tokens = 1, None, 0
    if probe:
        q1, k1, v1 = model.qkv(1, h)
        reused = (inp.have_kv & ~inp.exact_kv)[idx]
        dev = torch.zeros(n, device=h.device)
        r_pos = idx[reused]
        dk = (k1[:, reused] - inp.k_buf[1][:, r_pos]).pow(2).sum(dim=(0, 2))
        dv = (v1[:, reused] - inp.v_buf[1][:, r_pos]).pow(2).sum(dim=(0, 2))
        dev[r_pos] = (dk + dv).sqrt()
        mass1 = None
        if 1 in policy.mass_layers():
            # layer-1 heavy hitters: the last queries over layer-1 keys as the probe made them
            k1_all = inp.k_buf[1].clone()
            k1_all[:, idx] = k1
            mass1 = _attention_mass(model, model.rope(q1, idx), idx, model.rope(k1_all, pos_all))
        chosen = policy.select(inp, Probe(deviation=dev, mass=mass, mass1=mass1)) | fresh
        keep = chosen[idx]
        probe_tokens = len(idx)
        idx, h = idx[keep], h[keep]
        qkv1 = (q1[:, keep], k1[:, keep].contiguous(), v1[:, keep].contiguous())
    computed = torch.zeros(n, dtype=torch.bool, device=h.device)
    computed[idx] = True
    for layer in range(start, model.arch.num_layers):
        h = _layer(model, layer, h, idx, inp, pos_all, qkv1 if layer == 1 else None)
    flops, full = _count_flops(model, n, computed, layer0, probe_tokens)
    return PrefillResult(h[-1], computed, int(layer0.sum()), flops, full)
