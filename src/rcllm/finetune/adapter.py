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

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import RcllmError
from ..model.adapter_file import (  # noqa: F401 (the read side, re-exported)
    FORMAT, MANIFEST, WEIGHTS, adapted_fingerprint, apply_adapter, check_prompt_version,
    manifest_path, read_adapter, read_manifest, sha256_file)

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


def _rewrite(folder: Path, manifest: dict) -> None:
    """Writes an updated manifest in place (the weights and their checksum unchanged)."""
    write_atomic(Path(folder) / MANIFEST,
                 lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=2)))


def record_fast_path(folder: Path, chosen: dict) -> None:
    """Rewrites the manifest with the fast path validated for the adapter (`fast_path`); the
    path it was trained for stays under `trained_fast_path`. The weights are not touched."""
    manifest = read_manifest(folder)
    manifest.setdefault("trained_fast_path", manifest.get("fast_path"))
    manifest["fast_path"] = chosen
    _rewrite(folder, manifest)


def record_learnt(folder: Path, check: dict) -> None:
    """Rewrites the manifest with whether the run learnt anything (`"learnt"`: true, false or
    null, and `learnt_check`, `finetune.learnt`). An adapter that learnt nothing names no fast
    path (`fast_path` null; the path it was trained for stays under `trained_fast_path`): its
    rankings are the untuned model's. The weights are not touched."""
    manifest = read_manifest(folder)
    manifest["learnt"], manifest["learnt_check"] = check["learnt"], check
    if check["learnt"] is False:
        manifest.setdefault("trained_fast_path", manifest.get("fast_path"))
        manifest["fast_path"] = None
    _rewrite(folder, manifest)


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


# what a manifest from before a prompt option existed was trained with
LEGACY_PROMPT = {"item_ending": "name", "block_ending": "answer", "history_style": "dated"}


def trained_prompt(manifest: dict):
    """The PromptConfig an adapter was trained with; options its manifest predates are read as
    the values they had then (`LEGACY_PROMPT`), whatever today's defaults are."""
    from ..config import PromptConfig

    return PromptConfig(**{**LEGACY_PROMPT, **manifest["prompt"]})


def eval_settings(cfg, path: str | Path, chosen: frozenset[str] | None = None):
    """The engine config to evaluate the adapter at `path` with, and its (fractions, seed) user
    split: model.adapter is set and the prompt settings it was trained with are adopted, and
    the fast path its manifest names (`fast_path`: its item tail, late layer, rcllm selection
    and ratios); when that path had the user side exact, the user side is cached exactly
    (`reuse.user_side=behind`). An adapter of another prompt version is refused. A reuse option
    in `chosen` (the dotted names the user set, `launch.chosen_options`) is kept whatever its
    value; with `chosen` None, one that differs from its default is kept.

    `cfg` is an RcllmConfig; a prompt that was changed from the defaults and differs from the
    adapter's is refused (the ranker would be scored on prompts it never saw).
    """
    import dataclasses

    from ..config import PromptConfig, ReuseConfig

    manifest = read_manifest(path)
    check_prompt_version(manifest, path)
    trained = trained_prompt(manifest)
    if cfg.prompt not in (PromptConfig(), trained):
        raise RcllmError(f"the adapter was trained with prompt settings {manifest['prompt']}; "
                         f"drop the prompt.* overrides (they are adopted) or match them")
    cfg = dataclasses.replace(cfg, prompt=trained,
                              model=dataclasses.replace(cfg.model, adapter=str(path)))
    fast = fast_path(manifest)
    if fast:
        base = ReuseConfig()

        def free(name: str) -> bool:     # the adapter may set reuse.<name>
            if chosen is not None:
                return f"reuse.{name}" not in chosen
            return getattr(cfg.reuse, name) == getattr(base, name)

        adopt = {}
        if int(fast["item_tail"]) and free("item_tail"):   # the tail it was trained to compute
            adopt["item_tail"] = int(fast["item_tail"])
        if fast.get("method") == "late" and free("late_layer"):
            # validated as late@s: the served late method joins the user at that layer
            adopt["late_layer"] = int(fast["late_layer"])
        if fast.get("method") == "rcllm" and free("rcllm_select"):
            # validated as rcllm with a selection at its budget: served with them
            adopt.update({name: type(getattr(base, name))(fast[name])
                          for name in ("rcllm_select", "overlap_fill", "item_ratio",
                                       "history_ratio") if name in fast and free(name)})
        if fast.get("user_side") == "exact" and free("user_side"):
            # trained with the user side exact: the user-prefix cache serves it exactly (built
            # behind the answer of a miss, which itself is served from reused history chunks)
            adopt["user_side"] = "behind"
        cfg = dataclasses.replace(cfg, reuse=dataclasses.replace(cfg.reuse, **adopt))
    split = manifest["split"]
    return cfg, tuple(split["fractions"]), int(split["seed"])


def trained_scorer(path: str | Path) -> str:
    """The engine scorer that ranks the way the adapter at `path` was trained to: pointwise
    for `train.objective=pointwise`, the verbalizer for listwise (and adapters from before the
    option existed)."""
    objective = read_manifest(path).get("train", {}).get("objective", "listwise")
    return "pointwise" if objective == "pointwise" else "verbalizer"


def trained_method(path: str | Path) -> str:
    """The reuse method that matches the adapter at `path`: the fast path its manifest names
    (naive: item KV reused as is, its item tail computed; late: item tokens computed against
    the user from `late_layer` up; rcllm: its selection's share of the item tokens computed —
    what `rcllm finetune` validated) when it has one; otherwise
    "rcllm" (a budget of reused tokens recomputed)."""
    fast = fast_path(read_manifest(path))
    return fast["method"] if fast else "rcllm"
