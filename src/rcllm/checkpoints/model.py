"""A small recurrent language model whose state can be snapshotted and resumed exactly.

Each layer is Mamba-2 / gated-linear-attention shaped: RMSNorm → input projection → a causal
depthwise convolution (width W) → per-head decayed outer-product recurrence
S_t = a_t·S_{t−1} + k_t ⊗ v_t, y_t = q_t·S_t → output projection, then a SiLU MLP; all with
residuals. The state after c tokens is, per layer, the last W − 1 convolution inputs and the
[H, Dk, Dv] matrix S — exactly what a hybrid model's recurrent layers must store per checkpoint
(its size grows with head_dim², unlike per-token attention KV).

Exactness. Resuming from a snapshot at c and prefilling tokens c..t must equal prefilling 0..t.
The recurrence runs token by token with the same shapes in both cases. The dense parts
(projections, norms, MLP) run on chunks that are always padded to `chunk_tokens` rows, so both
runs call the same kernels with the same shapes; on CPU this makes the outputs bit-identical
(tests assert torch.equal). A backend whose kernels differ per row offset would only promise
allclose; tests also state that tolerance (1e-5, float32).

Random weights (seeded): exactness and timing do not depend on trained weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..errors import RcllmError


@dataclass(frozen=True)
class RecurrentConfig:
    vocab: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int = 32
    conv_width: int = 4
    chunk_tokens: int = 64  # rows per dense-kernel call (every call is padded to this)
    seed: int = 0

    @property
    def inner(self) -> int:  # width of the q|k|v stream that goes through the convolution
        return 3 * self.n_heads * self.head_dim


@dataclass(frozen=True)
class LayerState:
    conv: torch.Tensor  # [W − 1, inner]: the last W − 1 convolution inputs
    ssm: torch.Tensor   # [H, Dk, Dv]: the recurrent matrix


@dataclass(frozen=True)
class RecurrentState:
    """The model state after `position` tokens. Immutable by convention: never modify tensors."""

    position: int
    layers: tuple[LayerState, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.layers for t in (s.conv, s.ssm))

    def clone(self) -> "RecurrentState":
        """A deep copy (what loading a checkpoint from a store into the runtime costs)."""
        return RecurrentState(self.position, tuple(LayerState(s.conv.clone(), s.ssm.clone())
                                                   for s in self.layers))

    def equal(self, other: "RecurrentState") -> bool:
        """Bitwise equality of every tensor (and the same position)."""
        return self.position == other.position and all(
            torch.equal(a.conv, b.conv) and torch.equal(a.ssm, b.ssm)
            for a, b in zip(self.layers, other.layers))

    def max_abs_diff(self, other: "RecurrentState") -> float:
        return max(float((a - b).abs().max()) for x, y in zip(self.layers, other.layers)
                   for a, b in ((x.conv, y.conv), (x.ssm, y.ssm)))


@dataclass(frozen=True)
class PrefillResult:
    state: RecurrentState          # after the last token
    hidden: torch.Tensor           # [T, d_model]: final-layer output of every processed token
    snapshots: dict[int, RecurrentState]  # absolute position -> state there (requested stops)

    def last_logits(self, model: "RecurrentLM") -> torch.Tensor:
        return model.logits(self.hidden[-1:])[0]  # [vocab]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


class RecurrentLM(torch.nn.Module):
    """The model; `prefill` is the only entry point that advances a state."""

    def __init__(self, cfg: RecurrentConfig = RecurrentConfig()):
        super().__init__()
        if min(cfg.vocab, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.head_dim,
               cfg.conv_width, cfg.chunk_tokens) < 1:
            raise RcllmError("every RecurrentConfig size must be >= 1")
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        d, e, h = cfg.d_model, cfg.inner, cfg.n_heads

        def param(*shape: int, scale: float) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * scale, requires_grad=False)

        self.embed = param(cfg.vocab, d, scale=1.0)
        self.w_in = torch.nn.ParameterList([param(d, e + h * cfg.head_dim, scale=d ** -0.5) for _ in range(cfg.n_layers)])
        self.conv_w = torch.nn.ParameterList([param(cfg.conv_width, e, scale=0.5) for _ in range(cfg.n_layers)])
        self.decay_bias = torch.nn.ParameterList([param(h * cfg.head_dim, scale=1.0) for _ in range(cfg.n_layers)])
        self.w_out = torch.nn.ParameterList([param(h * cfg.head_dim, d, scale=(h * cfg.head_dim) ** -0.5)
                                             for _ in range(cfg.n_layers)])
        self.w_up = torch.nn.ParameterList([param(d, 2 * d, scale=d ** -0.5) for _ in range(cfg.n_layers)])
        self.w_down = torch.nn.ParameterList([param(2 * d, d, scale=(2 * d) ** -0.5) for _ in range(cfg.n_layers)])
        self.norm_w = torch.nn.Parameter(torch.ones(d), requires_grad=False)
        self.lm_head = param(d, cfg.vocab, scale=d ** -0.5)

    def zero_state(self) -> RecurrentState:
        c = self.cfg
        return RecurrentState(0, tuple(
            LayerState(torch.zeros(c.conv_width - 1, c.inner), torch.zeros(c.n_heads, c.head_dim, c.head_dim))
            for _ in range(c.n_layers)))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return _rms_norm(hidden, self.norm_w) @ self.lm_head  # [T, vocab]

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, state: RecurrentState | None = None,
                stops: Sequence[int] = ()) -> PrefillResult:
        """Advances `state` (default: the zero state) over `tokens` ([T] int64).

        stops: absolute positions p with state.position < p <= state.position + T at which a
        snapshot is returned (others are ignored). `state` itself is not modified.
        """
        state = state or self.zero_state()
        if tokens.ndim != 1 or tokens.numel() == 0:
            raise RcllmError("prefill needs a non-empty 1-D tensor of token ids")
        start, end = state.position, state.position + tokens.numel()
        wanted = set(stops)
        cuts = sorted({p for p in wanted if start < p <= end}
                      | set(range(start - start % self.cfg.chunk_tokens + self.cfg.chunk_tokens,
                                   end, self.cfg.chunk_tokens)) | {end})
        layers, hidden, snaps, pos = list(state.layers), [], {}, start
        for cut in cuts:
            x = self.embed[tokens[pos - start:cut - start]]  # [r, D]
            for i in range(self.cfg.n_layers):
                x, layers[i] = self._layer(i, x, layers[i])
            hidden.append(x)
            pos = cut
            if cut in wanted:
                snaps[cut] = RecurrentState(cut, tuple(layers))
        return PrefillResult(RecurrentState(end, tuple(layers)), torch.cat(hidden), snaps)

    def _dense(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w with x padded to chunk_tokens rows, so every call has the same shape."""
        pad = self.cfg.chunk_tokens - x.shape[0]
        return (F.pad(x, (0, 0, 0, pad)) @ w)[: x.shape[0]]

    def _layer(self, i: int, x: torch.Tensor, st: LayerState) -> tuple[torch.Tensor, LayerState]:
        c, r = self.cfg, x.shape[0]
        h, dh, e = c.n_heads, c.head_dim, c.inner
        z = self._dense(_rms_norm(x, self.norm_w), self.w_in[i])  # [r, e + H·Dk]
        ext = torch.cat([st.conv, z[:, :e]])                     # [W − 1 + r, e]
        u = ext[0:r] * self.conv_w[i][0]
        for j in range(1, c.conv_width):                          # plain mul/add: exact per element
            u = u + ext[j:j + r] * self.conv_w[i][j]
        u = F.silu(u)
        q, k, v = u.view(r, 3, h, dh).unbind(1)                   # each [r, H, D]
        k = k / (k.norm(dim=-1, keepdim=True) + 1e-6)
        # per-key-channel decay in (0, 1), [r, H, Dk]; rows are H·Dk wide (a multiple of the SIMD
        # width) so no token ever lands in a kernel's scalar tail, whose exp differs from the vector one
        a = torch.sigmoid(z[:, e:] + self.decay_bias[i]).view(r, h, dh)
        s, ys = st.ssm, []
        for t in range(r):                                        # the recurrence, token by token
            s = s * a[t, :, :, None] + k[t, :, :, None] * v[t, :, None, :]
            ys.append((q[t, :, :, None] * s).sum(1))              # [H, Dv]
        y = torch.stack(ys).reshape(r, h * dh)
        x = x + self._dense(y, self.w_out[i])
        x = x + self._dense(F.silu(self._dense(_rms_norm(x, self.norm_w), self.w_up[i])), self.w_down[i])
        return x, LayerState(ext[-(c.conv_width - 1):].clone() if c.conv_width > 1 else st.conv, s)
