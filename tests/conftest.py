"""Shared fixtures: the real bundled model (one per session) and tiny random-weight models.

Tiny models reuse the real tokenizer (vocabulary 49,152) with a few small random layers, so
engine tests exercise real prompts in seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rcllm.config import ModelConfig
from rcllm.model.arch import ModelArch
from rcllm.model.loading import build_transformer, load_model

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


@pytest.fixture(scope="session")
def real_model():
    torch.set_num_threads(2)
    return load_model(ModelConfig())


@pytest.fixture(scope="session")
def tiny_model_dir(real_model, tmp_path_factory) -> Path:
    """A saved tiny llama (random weights) with the real tokenizer: a full model folder."""
    from safetensors.torch import save_file

    hf, cfg = tiny_hf_model("llama")
    out = tmp_path_factory.mktemp("tiny-llama")
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg))
    for f in real_model.folder.glob("*"):
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    return load_model(ModelConfig(path=str(tiny_model_dir), threads=0))
