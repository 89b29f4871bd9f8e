"""The architecture facts the transformer needs, read from a Hugging Face config dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import RcllmError

# model_type -> (q/k RMS-norm per head, bias on q/k/v projections)
SUPPORTED = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (False, True),
    "qwen3": (True, False),
}


@dataclass(frozen=True)
class ModelArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_positions: int
    tie_embeddings: bool
    qk_norm: bool
    qkv_bias: bool

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> "ModelArch":
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED:
            raise RcllmError(f"unsupported architecture {model_type!r}; rcllm runs "
                             f"{', '.join(sorted(SUPPORTED))}")
        qk_norm, qkv_bias = SUPPORTED[model_type]
        if model_type == "llama":
            qkv_bias = bool(cfg.get("attention_bias", False))
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
        if rope_type not in ("default", None):
            raise RcllmError(f"unsupported RoPE scaling {rope_type!r} (only default RoPE)")
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rope_theta=float(theta),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_positions=int(cfg.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=qk_norm,
            qkv_bias=qkv_bias,
        )

    @property
    def kv_bytes_per_token_fp32(self) -> int:
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * 4

    def params_per_token_flops(self) -> int:
        """FLOPs of the linear layers for one token (2 per multiply-add), no attention."""
        d, h, kv, hd, f = (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                           self.intermediate_size)
        per_layer = d * (h * hd) + 2 * d * (kv * hd) + (h * hd) * d + 3 * d * f
        return 2 * self.num_layers * per_layer

    def attention_flops(self, pairs: int) -> int:
        """FLOPs of QK^T and PV over `pairs` (query, key) pairs summed over layers."""
        return 4 * self.num_layers * self.num_heads * self.head_dim * pairs
