"""A plain-torch Llama-family decoder with explicit positions.

The class exposes the per-layer primitives the selective prefill composes (project
q/k/v for a subset of tokens, attend over all keys, finish the layer) and a straightforward
`forward` for the exact paths (full prefill, prefix continuation, chunk builds).

Conventions (shapes in comments): a single sequence, no batch dimension; hidden states
[n, d]; keys and values per layer [H_kv, N, D]; keys are stored *pre-RoPE* and rotated when
attended, so cached keys are position independent. Key slot index == token position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .arch import ModelArch

# The masked path splits the queries into at most this many blocks, each attending only to the
# key prefix it can see. Measured here (700 of 2048 queries, SmolLM2 shapes, 2 threads): one
# masked call 32 ms, 3 blocks 22 ms, 8 blocks 21 ms; more blocks add per-call overhead.
ATTN_MAX_BLOCKS = 8
ATTN_MIN_BLOCK = 32


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor        # [d]
    w_qkv: torch.Tensor            # [(H + 2 H_kv) D, d]  q, k, v fused: one matmul
    b_qkv: torch.Tensor | None     # [(H + 2 H_kv) D]
    q_norm: torch.Tensor | None    # [D] (Qwen3)
    k_norm: torch.Tensor | None    # [D]
    w_o: torch.Tensor              # [d, H D]
    mlp_norm: torch.Tensor         # [d]
    w_gate_up: torch.Tensor        # [2 f, d]  gate and up fused
    w_down: torch.Tensor           # [d, f]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class Transformer:
    def __init__(self, arch: ModelArch, embed: torch.Tensor, layers: list[LayerWeights],
                 final_norm: torch.Tensor, lm_head: torch.Tensor):
        self.arch = arch
        self.embed_tokens = embed      # [V, d]
        self.layers = layers
        self.final_norm = final_norm   # [d]
        self.lm_head = lm_head         # [V, d] (the embedding itself when tied)
        self.device = embed.device
        self.dtype = embed.dtype
        half = arch.head_dim // 2
        inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, half, dtype=torch.float64) / half))
        pos = torch.arange(arch.max_positions, dtype=torch.float64)
        angles = torch.outer(pos, inv_freq)                      # [P, D/2]
        self._cos = angles.cos().to(self.dtype).to(self.device)  # computed in fp64 once
        self._sin = angles.sin().to(self.dtype).to(self.device)

    # ---- primitives -------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens[ids]                             # [n, d]

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotates x [heads, n, D] to `positions` [n] (rotate-half convention)."""
        cos = self._cos[positions]                                # [n, D/2]
        sin = self._sin[positions]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def qkv(self, layer: int, h: torch.Tensor):
        """Projects hidden states h [n, d] → q [H, n, D], k [H_kv, n, D] (pre-RoPE), v."""
        a, w = self.arch, self.layers[layer]
        x = rms_norm(h, w.attn_norm, a.rms_eps)
        qkv = F.linear(x, w.w_qkv, w.b_qkv)                       # [n, (H + 2 H_kv) D]
        n = h.shape[0]
        hq, hk = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        q = qkv[:, :hq].view(n, a.num_heads, a.head_dim).transpose(0, 1)
        k = qkv[:, hq:hq + hk].view(n, a.num_kv_heads, a.head_dim).transpose(0, 1)
        v = qkv[:, hq + hk:].view(n, a.num_kv_heads, a.head_dim).transpose(0, 1)
        if w.q_norm is not None:
            q = rms_norm(q, w.q_norm, a.rms_eps)
            k = rms_norm(k, w.k_norm, a.rms_eps)
        return q, k.contiguous(), v.contiguous()

    def finish(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """attn [H, n, D] → residual + o-proj, then the MLP block. Returns new h [n, d]."""
        a, w = self.arch, self.layers[layer]
        n = h.shape[0]
        h = h + F.linear(attn.transpose(0, 1).reshape(n, a.num_heads * a.head_dim), w.w_o)
        x = rms_norm(h, w.mlp_norm, a.rms_eps)
        gate, up = F.linear(x, w.w_gate_up).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, w.w_down)

    def layer(self, layer: int, h: torch.Tensor, q_pos: torch.Tensor, keys, attend,
              qkv=None, seen=None):
        """The one layer body every forward runs (this model's `forward`, the selective
        prefill's layers, layer 0 with the probe): hidden states h [n, d] of tokens at
        positions q_pos [n] → (new h [n, d], their pre-RoPE k, v [H_kv, n, D]).

        The callers differ only through hooks: `keys(k, v)` keeps the new tokens' K/V where the
        caller holds KV and returns (rotated keys, values) of every slot the queries may see;
        `attend(q_rot, k_rot, v)` is the attention [H, n, D] under the caller's layout;
        `seen(q_rot, k_rot)` reads both before it (the probe's attention mass). `qkv`: the
        projections of h when already made (the probe makes layer 1's)."""
        q, k, v = qkv if qkv is not None else self.qkv(layer, h)
        k_rot, v_all = keys(k, v)
        q_rot = self.rope(q, q_pos)
        if seen is not None:
            seen(q_rot, k_rot)
        return self.finish(layer, h, attend(q_rot, k_rot, v_all)), k, v

    def layer_after(self, layer: int, h: torch.Tensor, positions: torch.Tensor,
                    all_pos: torch.Tensor, past_k: torch.Tensor | None = None,
                    past_v: torch.Tensor | None = None):
        """`layer` over tokens at `positions` [n] that follow a past of P slots (this layer's
        pre-RoPE K/V [H_kv, P, D], or None) and see it and each other causally; `all_pos`
        [P + n] the positions of past and new slots. → (h, k, v) as `layer`."""
        def keys(k, v):
            if past_k is not None:
                k, v = torch.cat((past_k, k), dim=1), torch.cat((past_v, v), dim=1)
            return self.rope(k, all_pos), v

        def attend(q_rot, k_rot, v_all):
            return self.attend(q_rot, positions, k_rot, v_all)

        return self.layer(layer, h, positions, keys, attend)

    def attend(self, q: torch.Tensor, q_pos: torch.Tensor, k_rot: torch.Tensor,
               v: torch.Tensor) -> torch.Tensor:
        """Causal attention of queries q [H, n, D] at sorted positions q_pos [n] over keys
        k_rot/v [H_kv, N, D] whose slot index is their position. Returns [H, n, D].

        When the queries are exactly positions 0..N-1 the fused causal kernel runs; otherwise
        queries go in blocks, each over only the key prefix it can see, so the work follows
        the causal triangle instead of the full rectangle.
        """
        n, big_n = q.shape[1], k_rot.shape[1]
        gqa = self.arch.num_heads != self.arch.num_kv_heads
        if n == big_n:  # every slot queries: plain causal attention, whatever the positions
            return F.scaled_dot_product_attention(
                q.unsqueeze(0), k_rot.unsqueeze(0), v.unsqueeze(0), is_causal=True,
                enable_gqa=gqa).squeeze(0)
        past = big_n - n
        if past * 8 <= n and int(q_pos[0]) == past and int(q_pos[-1]) == big_n - 1:
            # the queries are the last n slots after a short past (an exact prefix hit, the
            # probe's layer 0): zero query rows for the past let the fused causal kernel run;
            # their outputs are dropped. Costs past^2/2 extra pairs, hence the bound on past.
            padded = torch.cat((q.new_zeros(q.shape[0], past, q.shape[2]), q), dim=1)
            return F.scaled_dot_product_attention(
                padded.unsqueeze(0), k_rot.unsqueeze(0), v.unsqueeze(0), is_causal=True,
                enable_gqa=gqa).squeeze(0)[:, past:]
        out = torch.empty_like(q)
        blocks = max(1, min(ATTN_MAX_BLOCKS, n // ATTN_MIN_BLOCK))
        step = -(-n // blocks)
        for start in range(0, n, step):
            pos = q_pos[start:start + step]
            last = int(pos[-1]) + 1
            mask = torch.arange(last, device=q.device).unsqueeze(0) <= pos.unsqueeze(1)
            # contiguous query slices keep SDPA on its fast path (a strided view was 3x slower)
            out[:, start:start + len(pos)] = F.scaled_dot_product_attention(
                q[:, start:start + len(pos)].contiguous().unsqueeze(0),
                k_rot[:, :last].unsqueeze(0), v[:, :last].unsqueeze(0), attn_mask=mask,
                enable_gqa=gqa).squeeze(0)
        return out

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """Hidden state(s) [..., d] → vocabulary logits [..., V] (final norm included)."""
        return F.linear(rms_norm(h_last, self.final_norm, self.arch.rms_eps), self.lm_head)

    def final_hidden(self, h_last: torch.Tensor) -> torch.Tensor:
        return rms_norm(h_last, self.final_norm, self.arch.rms_eps)

    # ---- exact forward ----------------------------------------------------------------
    def forward(self, ids: torch.Tensor, past_k: torch.Tensor | None = None,
                past_v: torch.Tensor | None = None, return_kv: bool = False,
                return_hidden: bool = False, start_pos: int = 0, logits: bool = True):
        """Runs tokens `ids` [n] at positions P..P+n-1 after a past of P tokens.

        past_k/past_v: [L, H_kv, P, D] (keys pre-RoPE) or None. Without a past, `start_pos`
        shifts the positions (the tokens then see only each other). Returns a dict with
        `logits` [V] of the last token (unless `logits` is False: a KV build skips the output
        head, ~8 ms of a 75–100 ms 16–32-token build of SmolLM2-135M on one CPU thread), and on
        request `k`/`v` [L, H_kv, n, D] of the new tokens (pre-RoPE) and `hidden` [d] (the
        final-normed last hidden state).
        """
        a = self.arch
        past = 0 if past_k is None else past_k.shape[2]
        n = ids.shape[0]
        total = past + n
        if past and start_pos:
            raise ValueError("start_pos is only for a forward without a past")
        positions = torch.arange(past, total, device=self.device) + start_pos
        all_pos = torch.arange(total, device=self.device) + start_pos
        h = self.embed(ids)
        ks, vs = [], []
        for layer in range(a.num_layers):
            h, k, v = self.layer_after(layer, h, positions, all_pos,
                                       past_k[layer] if past else None,
                                       past_v[layer] if past else None)
            if return_kv:
                ks.append(k)
                vs.append(v)
        out = {"logits": self.logits(h[-1])} if logits else {}
        if return_kv:
            out["k"] = torch.stack(ks)
            out["v"] = torch.stack(vs)
        if return_hidden:
            out["hidden"] = self.final_hidden(h[-1])
        return out

    def scale(self) -> float:
        return 1.0 / math.sqrt(self.arch.head_dim)
