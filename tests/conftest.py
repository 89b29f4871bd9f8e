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
from rcllm.model.loading import load_model
from tiny_models import tiny_hf_model

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
