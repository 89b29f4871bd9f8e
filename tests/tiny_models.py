"""Tiny random-weight Llama / Qwen2 / Qwen3 models for fast tests (see conftest fixtures)."""

from __future__ import annotations

import torch

from rcllm.model.arch import ModelArch
from rcllm.model.loading import build_transformer

TINY = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"]),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16),
}


def tiny_config(kind: str = "llama", vocab: int = 49152, layers: int = 3,
                max_positions: int = 4096) -> dict:
    return {**TINY[kind], "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": kind != "qwen2",
            "max_position_embeddings": max_positions, "torch_dtype": "float32"}


def tiny_hf_model(kind: str = "llama", seed: int = 0, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_config(kind, **kw)
    torch.manual_seed(seed)
    hf_cfg = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(hf_cfg)
    with torch.no_grad():  # random norms/biases so that every weight matters in parity tests
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    return model, cfg


def tiny_transformer(kind: str = "llama", **kw):
    hf, cfg = tiny_hf_model(kind, **kw)
    arch = ModelArch.from_hf_config(hf.config.to_dict())
    return hf, build_transformer(arch, dict(hf.state_dict()), torch.float32, "cpu")


