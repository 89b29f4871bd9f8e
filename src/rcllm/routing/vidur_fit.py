"""GPU profiles fitted from vidur's per-operator timings (A100-80GB, H100).

vidur's `mlp.csv` files time every non-attention operator of one decoder layer for a range of
batch token counts and tensor-parallel degrees. In the prefill regime (≥ 512 tokens) the layer
time is linear in tokens: time_ms = a + b·tokens. The slope gives the linear-layer efficiency,
efficiency = FLOPs per token per layer per GPU / (b · peak); the intercept gives a per-forward
fixed cost. A model without its own profile borrows the efficiency of the closest shape
(Qwen3-8B ← Llama-3-8B on A100, ← Llama-2-7B on H100). Attention is not in these files and is
modelled analytically (`profiles.gpu_profile`, 50% of peak).

`BAKED` holds the results of `fit_all(DEFAULT_DIR)` so the package works without the data
folder; a test re-fits when the folder exists and checks them.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import numpy as np

from ..errors import RcllmError
from .profiles import MODELS, PEAK_FLOPS, ModelSpec, SpeedProfile, gpu_profile

DEFAULT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data",
                           "vidur-profiles")
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
MIN_PREFILL_TOKENS = 512

# (device, model we simulate, vidur profile file stem, model the profile measured, TP degree)
TARGETS = (
    ("a100", "qwen3-8b", "Meta-Llama-3-8B", "llama3-8b", 1),
    ("h100", "qwen3-8b", "Llama-2-7b-hf", "llama2-7b", 1),
    ("a100", "qwen-72b", "Qwen-72B", "qwen-72b", 4),
    ("h100", "qwen-72b", "Qwen-72B", "qwen-72b", 4),
)


@dataclass(frozen=True)
class LayerFit:
    """One fitted line of a vidur profile: per-layer ms = intercept_ms + slope_ms·tokens."""

    intercept_ms: float
    slope_ms: float
    efficiency: float   # linear FLOPs / (slope · peak)
    rows: int


def read_layer_times(path: str, tensor_parallel: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, per-layer median ms) of the rows with the given TP degree, tokens ascending."""
    if not os.path.exists(path):
        raise RcllmError(f"vidur profile not found: {path}")
    tokens, times = [], []
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if int(row["num_tensor_parallel_workers"]) != tensor_parallel:
                continue
            tokens.append(int(row["num_tokens"]))
            times.append(sum(float(row[f"time_stats.{op}.median"]) for op in LAYER_OPS))
    order = np.argsort(tokens)
    return np.asarray(tokens, float)[order], np.asarray(times, float)[order]


def fit_layer(path: str, device: str, measured: ModelSpec, tensor_parallel: int) -> LayerFit:
    """Least-squares line through the prefill-regime rows of one profile."""
    tokens, times = read_layer_times(path, tensor_parallel)
    keep = tokens >= MIN_PREFILL_TOKENS
    if keep.sum() < 3:
        raise RcllmError(f"{path}: fewer than 3 rows with >= {MIN_PREFILL_TOKENS} tokens")
    slope, intercept = np.polyfit(tokens[keep], times[keep], 1)
    flops = 2.0 * measured.linear_params_per_layer / tensor_parallel
    efficiency = flops / (slope * 1e-3 * PEAK_FLOPS[device])
    return LayerFit(float(intercept), float(slope), float(efficiency), int(keep.sum()))


def profile_from_fit(device: str, model: ModelSpec, fit: LayerFit,
                     tensor_parallel: int) -> SpeedProfile:
    """The simulated model's profile: borrowed efficiency, per-forward fixed cost."""
    fixed_ms = max(fit.intercept_ms, 0.0) * model.num_layers + 2.0  # + sampling/launch slack
    return gpu_profile(device, model, fit.efficiency, fixed_ms, tensor_parallel)


def fit_all(data_dir: str = DEFAULT_DIR) -> dict[str, tuple[LayerFit, SpeedProfile]]:
    """Fits every target; keys like 'qwen3-8b@a100'."""
    out = {}
    for device, model_name, stem, measured_name, tp in TARGETS:
        path = os.path.join(data_dir, device, f"{stem}_mlp.csv")
        fit = fit_layer(path, device, MODELS[measured_name], tp)
        out[f"{model_name}@{device}"] = (fit, profile_from_fit(device, MODELS[model_name], fit, tp))
    return out


# (linear efficiency, per-layer intercept ms) from fit_all() on the shared data; see module doc.
BAKED: dict[str, tuple[float, float]] = {
    "qwen3-8b@a100": (0.6771, 0.2539),
    "qwen3-8b@h100": (0.6490, 0.0908),
    "qwen-72b@a100": (0.6896, 0.2085),
    "qwen-72b@h100": (0.6696, 0.1458),
}


def builtin_profile(key: str) -> SpeedProfile:
    """'qwen3-8b@a100', 'qwen3-8b@h100', 'qwen-72b@a100', 'qwen-72b@h100' without the data."""
    for device, model_name, _stem, _measured, tp in TARGETS:
        if f"{model_name}@{device}" == key:
            eff, intercept = BAKED[key]
            return profile_from_fit(device, MODELS[model_name],
                                    LayerFit(intercept, 0.0, eff, 0), tp)
    known = ", ".join(f"{m}@{d}" for d, m, *_ in TARGETS)
    raise RcllmError(f"unknown GPU profile {key!r}; known: {known}")
