"""The adapter file format, read side: what loading a model with `model.adapter` needs.

An adapter folder (written by `rcllm finetune`, `finetune.adapter.save_adapter`) holds
`adapter.safetensors` (the LoRA factors) and `adapter.json` (the manifest: format, checksum,
base model fingerprint, scale, prompt version, training settings). Reading checks the format,
the checksum, the prompt version and the base model; the merge adds scale · B @ A to each
adapted weight, so the served model is a plain model (no LoRA at run time).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..config import PROMPT_VERSION
from ..errors import RcllmError

FORMAT = "rcllm-lora/1"
WEIGHTS = "adapter.safetensors"
MANIFEST = "adapter.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def manifest_path(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST
    if p.name == WEIGHTS:
        p = p.with_name(MANIFEST)
    if not p.is_file():
        raise RcllmError(f"adapter not found: {path} (give the folder `rcllm finetune` printed, "
                         f"or its {MANIFEST})")
    return p


def read_manifest(path: str | Path) -> dict:
    p = manifest_path(path)
    try:
        manifest = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise RcllmError(f"adapter manifest {p} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise RcllmError(f"{p} is not an rcllm adapter manifest (format {FORMAT})")
    return manifest


def ranks_untuned(path: str | Path | None) -> bool:
    """True when rankings are the base model's: no adapter, or one whose training run found it
    learnt nothing (manifest `"learnt": false`, written by `rcllm finetune`)."""
    return not path or read_manifest(path).get("learnt") is False


def read_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(factors, manifest); raises RcllmError on a missing file or a checksum mismatch."""
    manifest = read_manifest(path)
    weights = manifest_path(path).parent / manifest.get("weights", WEIGHTS)
    if not weights.is_file():
        raise RcllmError(f"adapter weights missing: {weights}")
    digest = sha256_file(weights)
    if digest != manifest.get("sha256"):
        raise RcllmError(f"adapter checksum mismatch for {weights}: the file changed after it "
                         f"was written (expected {str(manifest.get('sha256'))[:12]}…, got "
                         f"{digest[:12]}…); re-run `rcllm finetune`")
    try:
        factors = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise RcllmError(f"adapter weights {weights} are unreadable: {exc}") from None
    return factors, manifest


def check_prompt_version(manifest: dict, path: str | Path) -> None:
    """Raises RcllmError when the adapter at `path` was trained on prompts of another version
    than this rcllm builds (`config.PROMPT_VERSION`; adapters from before the field are
    version 1): its scores would be those of a prompt it never saw."""
    have = int(manifest.get("prompt_version", 1))
    if have != PROMPT_VERSION:
        raise RcllmError(f"adapter {path} was trained on prompt version {have}, but this rcllm "
                         f"builds prompt version {PROMPT_VERSION} (the item chunks' text "
                         f"changed): its rankings would be those of prompts it never saw. "
                         f"Train a new one with `rcllm finetune` (same --data/--set options).")


def adapted_fingerprint(base_fingerprint: str, adapter_sha256: str) -> str:
    return hashlib.sha256(f"{base_fingerprint}+lora:{adapter_sha256}".encode()).hexdigest()[:32]


def apply_adapter(state: dict[str, torch.Tensor], path: str | Path, base_fingerprint: str) -> str:
    """Merges the adapter at `path` into `state` (mutated); returns the new fingerprint."""
    factors, manifest = read_adapter(path)
    check_prompt_version(manifest, path)
    if manifest.get("base_fingerprint") != base_fingerprint:
        raise RcllmError(f"adapter {path} was trained on another model (fingerprint "
                         f"{str(manifest.get('base_fingerprint'))[:12]}…, this model "
                         f"{base_fingerprint[:12]}…)")
    merge_into_state(state, factors, float(manifest["scale"]))
    return adapted_fingerprint(base_fingerprint, manifest["sha256"])


def merge_into_state(state: dict[str, torch.Tensor], factors: dict[str, torch.Tensor],
                     scale: float) -> None:
    """W += scale · B @ A for every factor pair, in float32 (mutates `state`).

    Raises RcllmError when a factor names a weight the model lacks or has the wrong shape.
    """
    pairs = sorted(n[: -len(".lora_A")] for n in factors if n.endswith(".lora_A"))
    for base in pairs:
        name = base + ".weight"
        a, b = factors.get(base + ".lora_A"), factors.get(base + ".lora_B")
        if name not in state or b is None:
            raise RcllmError(f"the adapter does not fit this model: no weight {name!r} "
                             f"or a missing factor")
        w = state[name]
        if b.shape[0] != w.shape[0] or a.shape[1] != w.shape[1] or a.shape[0] != b.shape[1]:
            raise RcllmError(f"the adapter does not fit this model: {name} is "
                             f"{tuple(w.shape)}, factors {tuple(b.shape)} @ {tuple(a.shape)}")
        state[name] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
