"""Model shapes and device speed profiles: the numbers the cost model multiplies.

A `SpeedProfile` describes one (model, device) pair: how long a prefill forward takes as a
function of computed tokens and context length, what reused KV costs, and the bandwidths of
the tiers reused KV comes from. Profiles are plain frozen data, so the simulator and the real
router share them. GPU profiles come from `gpu_profile` (peak rate × efficiency fitted from the
vidur operator timings, see `vidur_fit`); the CPU profile from `fit.fit_cpu_profile`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import RcllmError

GB = 1e9
PCIE_BYTES_PER_S = 25 * GB           # host memory -> GPU, per GPU (PCIe 4.0 x16, effective)
NETWORK_BYTES_PER_S = 100e9 / 8      # 100 Gbps between nodes


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, enough to count FLOPs and KV bytes."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_hidden: int          # width of the gated MLP (up = gate = mlp_hidden)
    kv_dtype_bytes: int = 2  # bf16 KV on GPU; fp32 on the CPU engine

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of QKV, output and the gated MLP of one layer (norms are negligible)."""
        qkv = self.hidden * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        out = self.num_heads * self.head_dim * self.hidden
        return qkv + out + 3 * self.hidden * self.mlp_hidden

    @property
    def linear_flops_per_token(self) -> float:
        """2·params FLOPs per token over all layers (LM head only runs on the last token)."""
        return 2.0 * self.linear_params_per_layer * self.num_layers

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one (query, key) pair over all layers: QKᵀ and PV, 2 FLOPs per MAC each."""
        return 4.0 * self.num_heads * self.head_dim * self.num_layers

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes


MODELS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec("qwen3-8b", 36, 4096, 32, 8, 128, 12288),
    "qwen-72b": ModelSpec("qwen-72b", 80, 8192, 64, 64, 128, 24576),
    "llama3-8b": ModelSpec("llama3-8b", 32, 4096, 32, 8, 128, 14336),
    "llama2-7b": ModelSpec("llama2-7b", 32, 4096, 32, 32, 128, 11008),
    "smollm2-135m": ModelSpec("smollm2-135m", 30, 576, 9, 3, 64, 1536, kv_dtype_bytes=4),
}

# Dense bf16 tensor-core peaks from the vendors' data sheets (FLOP/s per GPU).
PEAK_FLOPS = {"a100": 312e12, "h100": 989e12}


@dataclass(frozen=True)
class SpeedProfile:
    """Prefill and transfer speed of one model on one device (or tensor-parallel group).

    prefill_ms = fixed_ms + ms_per_token·computed + ms_per_token_ctx·computed·context
                 + reuse_ms_per_token[method]·reused
    `reuse_ms_per_token` is the compute a method spends per reused token (RcLLM's full first
    layer, KV assembly and re-rotation on CPU); a method absent from it costs 0 per token.
    Transfer bandwidths are in bytes/s; `math.inf` means "already resident, free".
    """

    name: str
    model: ModelSpec
    fixed_ms: float
    ms_per_token: float
    ms_per_token_ctx: float
    reuse_ms_per_token: Mapping[str, float] = field(default_factory=dict)
    host_bytes_per_s: float = PCIE_BYTES_PER_S
    network_bytes_per_s: float = NETWORK_BYTES_PER_S
    overlap_fraction: float = 1.0     # share of prefill time that can hide KV transfer
    max_batch_tokens: int = 8192      # computed tokens one batched prefill may hold

    def __post_init__(self) -> None:
        for name in ("fixed_ms", "ms_per_token", "ms_per_token_ctx"):
            if not getattr(self, name) >= 0:
                raise RcllmError(f"profile {self.name}: {name} must be >= 0")
        if not 0.0 <= self.overlap_fraction <= 1.0:
            raise RcllmError(f"profile {self.name}: overlap_fraction must be within [0, 1]")
        if self.max_batch_tokens < 1:
            raise RcllmError(f"profile {self.name}: max_batch_tokens must be >= 1")

    def full_prefill_ms(self, tokens: int) -> float:
        """Time of a full prefill of `tokens` tokens (Full-Recompute, no queue)."""
        return self.fixed_ms + tokens * (self.ms_per_token + self.ms_per_token_ctx * tokens)

    def replace(self, **changes) -> "SpeedProfile":
        return dataclasses.replace(self, **changes)


def gpu_profile(device: str, model: ModelSpec, linear_efficiency: float, fixed_ms: float,
                tensor_parallel: int = 1, attention_efficiency: float = 0.5) -> SpeedProfile:
    """A GPU profile from the device's peak and fitted efficiencies.

    Tensor parallelism divides compute over `tensor_parallel` GPUs and gives each its own PCIe
    link (each GPU loads only its KV heads); the node still has one 100 Gbps NIC. RcLLM runs the
    first layer over every token, so a reused token costs 1/num_layers of a computed one.
    """
    if device not in PEAK_FLOPS:
        raise RcllmError(f"unknown device {device!r}; known: {', '.join(PEAK_FLOPS)}")
    peak = PEAK_FLOPS[device] * tensor_parallel
    ms_per_token = model.linear_flops_per_token / (peak * linear_efficiency) * 1e3
    # causal attention: a query attends to ~half the context on average when all are new,
    # to all of it when the rest is reused; use the mean of the two (documented in simulator.md)
    ms_per_token_ctx = 0.75 * model.attention_flops_per_pair / (peak * attention_efficiency) * 1e3
    return SpeedProfile(
        name=f"{model.name}@{device}x{tensor_parallel}", model=model, fixed_ms=fixed_ms,
        ms_per_token=ms_per_token, ms_per_token_ctx=ms_per_token_ctx,
        reuse_ms_per_token={"rcllm": ms_per_token / model.num_layers},
        host_bytes_per_s=PCIE_BYTES_PER_S * tensor_parallel)


def cpu_smollm2_profile() -> SpeedProfile:
    """SmolLM2-135M, fp32, 2 threads on this machine, before fitting to rcllm's own runs.

    Anchored on a transformers prefill of 2048 tokens taking ~5.5 s: ~435 GFLOP of linear
    layers at ~110 GFLOP/s and ~145 GFLOP of (eager) attention at ~95 GFLOP/s. KV stays in host
    memory, so transfer is free and the per-token cost of reuse is a fitted compute term.
    """
    model = MODELS["smollm2-135m"]
    ms_per_token = model.linear_flops_per_token / 110e9 * 1e3
    ms_per_token_ctx = 0.5 * model.attention_flops_per_pair / 95e9 * 1e3
    return SpeedProfile(
        name="smollm2-135m@cpu2", model=model, fixed_ms=20.0, ms_per_token=ms_per_token,
        ms_per_token_ctx=ms_per_token_ctx,
        reuse_ms_per_token={"prefix": 0.0, "rcllm": ms_per_token / model.num_layers},
        host_bytes_per_s=math.inf, network_bytes_per_s=NETWORK_BYTES_PER_S,
        overlap_fraction=0.0, max_batch_tokens=1)


# ---- profile files (a fitted profile saved at one start, loaded at the next) ----------
def save_profile(profile: SpeedProfile, path: str | Path) -> None:
    row = dataclasses.asdict(profile)
    row["reuse_ms_per_token"] = dict(profile.reuse_ms_per_token)
    Path(path).write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")


def load_profile(path: str | Path) -> SpeedProfile:
    """A profile written by `save_profile`; RcllmError when the file is not one."""
    try:
        row: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
        row["model"] = ModelSpec(**row["model"])
        for key in ("host_bytes_per_s", "network_bytes_per_s"):
            row[key] = float(row[key]) if row[key] is not None else math.inf
        return SpeedProfile(**row)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RcllmError(f"--profile {path}: not a saved speed profile ({exc})") from None
