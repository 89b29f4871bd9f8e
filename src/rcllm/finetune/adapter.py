"""The saved adapter: `adapter.safetensors` (the LoRA factors) + `adapter.json` (manifest).

The manifest names the base model's fingerprint, the LoRA shape, the prompt settings, prompt
version and user split it was trained with, the fast path it was trained for (`fast_path`:
method, item tail, user side; absent for a full-path-only adapter), the best validation, and
the SHA-256 of the safetensors file. Loading
verifies the checksum, the prompt version and the base fingerprint before anything is merged,
so a corrupted file, an adapter made for other weights or for another prompt is refused with
one clear error. No pickle anywhere.

The merged model's fingerprint is sha256(base fingerprint + adapter checksum): every chunk KV
and prefix-cache key changes with the adapter, so KV built under one adapter (or none) is never
reused under another.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import RcllmError
from .lora import merge_into_state

FORMAT = "rcllm-lora/1"
WEIGHTS = "adapter.safetensors"
MANIFEST = "adapter.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_atomic(path: Path, write) -> None:
    """Calls write(tmp_path) and renames the result into place (no half-written files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_adapter(folder: Path, factors: dict[str, torch.Tensor], manifest: dict) -> Path:
    """Writes the factors and the manifest (with their checksum); returns the manifest path."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in factors.items()}
    write_atomic(folder / WEIGHTS, lambda tmp: save_file(tensors, tmp))
    full = {**manifest, "format": FORMAT, "weights": WEIGHTS,
            "sha256": sha256_file(folder / WEIGHTS)}
    write_atomic(folder / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(full, indent=2)))
    return folder / MANIFEST


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
    than this rcllm builds (`prompt.builder.PROMPT_VERSION`; adapters from before the field are
    version 1): its scores would be those of a prompt it never saw."""
    from ..prompt.builder import PROMPT_VERSION

    have = int(manifest.get("prompt_version", 1))
    if have != PROMPT_VERSION:
        raise RcllmError(f"adapter {path} was trained on prompt version {have}, but this rcllm "
                         f"builds prompt version {PROMPT_VERSION} (the item chunks' text "
                         f"changed): its rankings would be those of prompts it never saw. "
                         f"Train a new one with `rcllm finetune` (same --data/--set options).")


def fast_path(manifest: dict) -> dict | None:
    """The fast path an adapter was trained for: {"method", "item_tail", "user_side"}, or None
    (trained on the full path only). Manifests from before the field say it with
    `train.reuse` / `train.reuse_tail` (reuse-aware stages: naive, user side exact)."""
    if "fast_path" in manifest:
        return manifest["fast_path"]
    train = manifest.get("train", {})
    if not train.get("reuse", False):
        return None
    return {"method": "naive", "item_tail": int(train.get("reuse_tail", 0)), "user_side": "exact"}


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


def eval_settings(cfg, path: str | Path):
    """The engine config to evaluate the adapter at `path` with, and its (fractions, seed) user
    split: model.adapter is set and the prompt settings it was trained with are adopted, and
    the item tail of the fast path it was trained for (`fast_path.item_tail` →
    `reuse.item_tail`); when that path had the user side exact, the user side is cached
    exactly (`reuse.user_side=behind`). An adapter of another prompt version is refused.

    `cfg` is an RcllmConfig; a prompt that was changed from the defaults and differs from the
    adapter's is refused (the ranker would be scored on prompts it never saw).
    """
    import dataclasses

    from ..config import PromptConfig

    manifest = read_manifest(path)
    check_prompt_version(manifest, path)
    trained = PromptConfig(**manifest["prompt"])
    if cfg.prompt not in (PromptConfig(), trained):
        raise RcllmError(f"the adapter was trained with prompt settings {manifest['prompt']}; "
                         f"drop the prompt.* overrides (they are adopted) or match them")
    cfg = dataclasses.replace(cfg, prompt=trained,
                              model=dataclasses.replace(cfg.model, adapter=str(path)))
    fast = fast_path(manifest)
    if fast:
        tail = int(fast["item_tail"])
        if tail and not cfg.reuse.item_tail:  # the item tail it was trained to compute
            cfg = dataclasses.replace(cfg, reuse=dataclasses.replace(cfg.reuse, item_tail=tail))
        if fast.get("user_side") == "exact" and cfg.reuse.user_side == "reuse":
            # trained with the user side exact: the user-prefix cache serves it exactly (built
            # behind the answer of a miss, which itself is served from reused history chunks)
            cfg = dataclasses.replace(cfg, reuse=dataclasses.replace(cfg.reuse,
                                                                     user_side="behind"))
    split = manifest["split"]
    return cfg, tuple(split["fractions"]), int(split["seed"])


def trained_scorer(path: str | Path) -> str:
    """The engine scorer that ranks the way the adapter at `path` was trained to: pointwise
    for `train.objective=pointwise`, the verbalizer for listwise (and adapters from before the
    option existed)."""
    objective = read_manifest(path).get("train", {}).get("objective", "listwise")
    return "pointwise" if objective == "pointwise" else "verbalizer"


def trained_method(path: str | Path) -> str:
    """The reuse method that matches how the adapter at `path` was trained: the fast path its
    manifest names (naive: item KV reused as is, its item tail computed) when it was trained
    for one; otherwise "rcllm" (a budget of reused tokens recomputed)."""
    fast = fast_path(read_manifest(path))
    return fast["method"] if fast else "rcllm"
