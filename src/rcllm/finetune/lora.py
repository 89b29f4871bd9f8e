"""Low-rank updates of the attention projections: W' = W + (alpha / r) · B @ A.

The factors are named after the Hugging Face weight they update,
`model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A` [r, in] and `.lora_B` [out, r], so the merge
at load time works on the state dict before the fused transformer is built (any supported
architecture). During training the transformer's fused `w_qkv` / `w_o` are replaced by
base + delta every step, which keeps the forward pass the engine's own: A is random, B starts at
zero, so step 0 is exactly the base model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import RcllmError
from ..model.arch import ModelArch
from ..model.transformer import Transformer
from .config import LoraConfig


def weight_name(layer: int, target: str) -> str:
    return f"model.layers.{layer}.self_attn.{target}_proj.weight"


def factor_names(layer: int, target: str) -> tuple[str, str]:
    base = weight_name(layer, target)[: -len(".weight")]
    return base + ".lora_A", base + ".lora_B"


def projection_shapes(arch: ModelArch) -> dict[str, tuple[int, int]]:
    """(out, in) of each adaptable projection."""
    d, q, kv = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return {"q": (q, d), "k": (kv, d), "v": (kv, d), "o": (d, q)}


@dataclass
class Lora:
    """The trainable factors by name (see module docstring) and the scale alpha / r."""

    cfg: LoraConfig
    factors: dict[str, torch.Tensor]

    @classmethod
    def init(cls, arch: ModelArch, cfg: LoraConfig, seed: int, dtype=torch.float32,
             device: str = "cpu") -> "Lora":
        if cfg.first_layer >= arch.num_layers:
            raise RcllmError(f"lora.first_layer={cfg.first_layer} but the model has "
                             f"{arch.num_layers} layers")
        gen = torch.Generator().manual_seed(seed)
        shapes = projection_shapes(arch)
        factors = {}
        for layer in range(cfg.first_layer, arch.num_layers):
            for t in cfg.target_list:
                out_f, in_f = shapes[t]
                a_name, b_name = factor_names(layer, t)
                # Kaiming-uniform-like A (as PEFT does), zero B: the update starts at 0
                bound = 1.0 / in_f ** 0.5
                a = (torch.rand(cfg.rank, in_f, generator=gen) * 2 - 1) * bound
                factors[a_name] = a.to(dtype=dtype, device=device).requires_grad_()
                factors[b_name] = torch.zeros(out_f, cfg.rank, dtype=dtype,
                                              device=device).requires_grad_()
        return cls(cfg, factors)

    def delta(self, layer: int, target: str) -> torch.Tensor | None:
        a_name, b_name = factor_names(layer, target)
        if a_name not in self.factors:
            return None
        return (self.factors[b_name] @ self.factors[a_name]) * self.cfg.scale  # [out, in]


def base_weights(model: Transformer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (w_qkv, w_o) each layer holds now: capture them before any patch is installed."""
    return [(w.w_qkv, w.w_o) for w in model.layers]


class LoraPatch:
    """Installs base + delta into a Transformer's fused weights; `restore()` puts the base back.

    The model is mutated in place (its LayerWeights hold the effective weights until restored),
    so use one patch per model at a time.
    """

    def __init__(self, model: Transformer, lora: Lora,
                 base: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
        """`base`: the unpatched (w_qkv, w_o) per layer, when the model may hold another
        patch's weights now (two adapters taking turns share the base they captured)."""
        self.model, self.lora = model, lora
        self.base = base if base is not None else base_weights(model)
        shapes = projection_shapes(model.arch)
        self.rows = [shapes[t][0] for t in ("q", "k", "v")]

    def install(self) -> None:
        """Recomputes every adapted layer's weights from the current factors (with autograd)."""
        for layer, w in enumerate(self.model.layers):
            base_qkv, base_o = self.base[layer]
            parts = [self.lora.delta(layer, t) for t in ("q", "k", "v")]
            if any(p is not None for p in parts):
                parts = [p if p is not None else base_qkv.new_zeros(rows, base_qkv.shape[1])
                         for p, rows in zip(parts, self.rows)]
                w.w_qkv = base_qkv + torch.cat(parts)
            d_o = self.lora.delta(layer, "o")
            if d_o is not None:
                w.w_o = base_o + d_o

    def restore(self) -> None:
        for (qkv, o), w in zip(self.base, self.model.layers):
            w.w_qkv, w.w_o = qkv, o
