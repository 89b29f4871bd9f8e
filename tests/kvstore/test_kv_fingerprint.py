"""The model fingerprint (part of every chunk key) covers the dtype and the adapter's shape
(issue 17): KV made in bfloat16 is never served under float32, and editing adapter.json's
alpha, rank or scale changes every key."""

import dataclasses
import json

from kv_helpers import write_adapter

from rcllm.config import ModelConfig
from rcllm.model.loading import load_model


def _cfg(tiny_model_dir, **kw):
    return ModelConfig(path=str(tiny_model_dir), threads=0, **kw)


def test_dtype_is_part_of_the_fingerprint(tiny_model_dir):
    f32 = load_model(_cfg(tiny_model_dir))
    bf16 = load_model(_cfg(tiny_model_dir, dtype="bfloat16"))
    again = load_model(_cfg(tiny_model_dir))
    assert bf16.fingerprint != f32.fingerprint
    assert again.fingerprint == f32.fingerprint


def test_adapter_alpha_rank_scale_and_dtype_change_the_fingerprint(tiny_model_dir, tmp_path):
    base = load_model(_cfg(tiny_model_dir))
    folder = write_adapter(tmp_path / "a", base, tiny_model_dir)
    tuned = load_model(_cfg(tiny_model_dir, adapter=str(folder)))
    assert tuned.fingerprint != base.fingerprint
    manifest_path = folder / "adapter.json"
    manifest = json.loads(manifest_path.read_text())
    seen = {tuned.fingerprint}
    for field, value in (("alpha", 4.0), ("rank", 8), ("scale", 2.0)):
        edited = {**manifest, field: value}
        manifest_path.write_text(json.dumps(edited))
        fp = load_model(_cfg(tiny_model_dir, adapter=str(folder))).fingerprint
        assert fp not in seen, f"editing {field} went undetected"
        seen.add(fp)
    manifest_path.write_text(json.dumps(manifest))
    assert load_model(_cfg(tiny_model_dir, adapter=str(folder))).fingerprint == tuned.fingerprint
    # the same adapter in another dtype: accepted, but keyed apart
    bf16 = load_model(_cfg(tiny_model_dir, adapter=str(folder), dtype="bfloat16"))
    assert bf16.fingerprint not in seen | {base.fingerprint}


def test_adapter_trained_in_bfloat16_loads_in_float32(tiny_model_dir, tmp_path):
    trained_in = load_model(_cfg(tiny_model_dir, dtype="bfloat16"))
    folder = write_adapter(tmp_path / "b", trained_in, tiny_model_dir)
    served = load_model(dataclasses.replace(_cfg(tiny_model_dir), adapter=str(folder)))
    assert served.fingerprint != load_model(_cfg(tiny_model_dir)).fingerprint
