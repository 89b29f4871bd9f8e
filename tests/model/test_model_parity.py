"""The plain-torch transformer matches transformers' own model on the same weights."""

import pytest
import torch

from tiny_models import tiny_transformer
from rcllm.config import ModelConfig
from rcllm.errors import RcllmError
from rcllm.model.arch import ModelArch
from rcllm.model.loading import load_model


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tiny_parity_each_architecture(kind):
    hf, model = tiny_transformer(kind, vocab=512)
    ids = torch.randint(0, 512, (77,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0, -1]
    out = model.forward(ids)["logits"]
    assert (ref - out).abs().max().item() < 1e-3


def test_prefix_continuation_equals_one_pass():
    _, model = tiny_transformer("qwen3", vocab=512)
    ids = torch.randint(0, 512, (60,), generator=torch.Generator().manual_seed(2))
    whole = model.forward(ids, return_kv=True)
    head = model.forward(ids[:25], return_kv=True)
    tail = model.forward(ids[25:], head["k"], head["v"], return_kv=True)
    assert torch.allclose(whole["logits"], tail["logits"], atol=1e-4)
    assert torch.allclose(whole["k"][:, :, 25:], tail["k"], atol=1e-4)
    # a KV build skips the output head: the same KV, bit for bit, and no logits
    bare = model.forward(ids[25:], head["k"], head["v"], return_kv=True, logits=False)
    assert "logits" not in bare
    assert torch.equal(bare["k"], tail["k"]) and torch.equal(bare["v"], tail["v"])


def test_real_model_parity(real_model):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(real_model.folder), dtype=torch.float32)
    text = "I subscribed to this magazine for the recipes and the travel stories. " * 12
    ids = torch.tensor(real_model.tokenizer(text)["input_ids"])
    with torch.no_grad():
        ref = hf(ids[None]).logits[0, -1]
    out = real_model.model.forward(ids)["logits"]
    assert (ref - out).abs().max().item() < 1e-3


def test_unknown_architecture_is_a_clear_error():
    with pytest.raises(RcllmError, match="unsupported architecture 'gpt2'"):
        ModelArch.from_hf_config({"model_type": "gpt2"})


def test_missing_and_unsupported_weights(tmp_path):
    with pytest.raises(RcllmError, match="not found"):
        load_model(ModelConfig(path=str(tmp_path / "nope.gguf")))
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"x")
    with pytest.raises(RcllmError, match="unsupported weights file"):
        load_model(ModelConfig(path=str(bad)))
    with pytest.raises(RcllmError, match="not a model folder"):
        load_model(ModelConfig(path=str(tmp_path)))
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(RcllmError, match="could not read GGUF"):
        load_model(ModelConfig(path=str(corrupt), cache_dir=str(tmp_path / "cache")))


@pytest.mark.parametrize("positions", [
    list(range(10, 200)),                 # suffix after a short past: padded causal kernel
    list(range(120, 200)),                # suffix after a long past: query blocks
    sorted(set(range(0, 200, 3)) | {199}),  # scattered queries: query blocks
])
def test_attention_paths_equal_masked_reference(positions):
    _, model = tiny_transformer("llama", vocab=512)
    a = model.arch
    g = torch.Generator().manual_seed(3)
    pos = torch.tensor(positions)
    q = torch.randn(a.num_heads, len(pos), a.head_dim, generator=g)
    k = torch.randn(a.num_kv_heads, 200, a.head_dim, generator=g)
    v = torch.randn(a.num_kv_heads, 200, a.head_dim, generator=g)
    rep = a.num_heads // a.num_kv_heads
    scores = q @ k.repeat_interleave(rep, 0).transpose(1, 2) * model.scale()
    scores.masked_fill_(torch.arange(200)[None, None] > pos[None, :, None], float("-inf"))
    ref = torch.softmax(scores, -1) @ v.repeat_interleave(rep, 0)
    assert torch.allclose(model.attend(q, pos, k, v), ref, atol=1e-5)
