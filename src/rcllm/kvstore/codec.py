"""Serialised KV entries: safetensors bytes with a checksummed, self-describing header.

Disk and Redis tiers store the same bytes. An entry is *valid* for a lookup of `key` only if
  1. it parses (safetensors header + tensors),
  2. its CRC-32 over (key, kind, fingerprint, token ids, every tensor's bytes) matches,
  3. the key recorded in it equals the key asked for,
  4. when the reader knows the model fingerprint: the recorded fingerprint equals it and
     chunk_key(fingerprint, kind, token_ids) == key (so wrong token ids or a key made for another
     model are caught even if the bytes are intact).
Anything else raises `InvalidEntry`; tiers turn that into a dropped entry and a miss. No pickle:
safetensors holds only raw tensors and a string→string header.

CRC-32 detects accidental corruption (torn writes, bit flips), not tampering; a shared Redis
that untrusted parties can write to needs authentication, not a stronger checksum.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Sequence

import safetensors.torch
import torch

from .base import ChunkKey, ChunkKV, chunk_key
from .int8 import dequantize, quantize_per_channel

FORMAT = "rcllm-kv-1"
ENCODINGS = ("raw", "int8")
# Chunk kinds tried when checking that a key matches its token ids (see KeyCheck).
DEFAULT_KINDS = ("item", "history", "instruction", "prototype", "prefix", "chunk")


class InvalidEntry(Exception):
    """A stored entry that must not be served (corrupt, mismatched, foreign format)."""


@dataclass(frozen=True)
class KeyCheck:
    """Knows the model fingerprint, so it can tell whether `key` is chunk_key(fp, kind, ids).

    kinds: the exact kind strings keys are made with; a put whose key matches none is refused
    by tiers holding a KeyCheck (it could never be validated on read). The engine keys chunks
    under tags `<kind>@<context>` (e.g. `item@3f2a…`): `kvstore.wiring.engine_key_check`
    lists them for an engine."""

    fingerprint: str
    kinds: Sequence[str] = DEFAULT_KINDS

    @staticmethod
    def base_kind(kind: str) -> str:
        """`item` for the tag `item@<context>` (and for `item`)."""
        return kind.split("@", 1)[0]

    def kind_of(self, key: ChunkKey, token_ids: Sequence[int]) -> str | None:
        """The kind k with chunk_key(fingerprint, k, token_ids) == key, or None."""
        for kind in self.kinds:
            if chunk_key(self.fingerprint, kind, token_ids) == key:
                return kind
        return None


def _checksum(key: str, kind: str, fingerprint: str, tensors: dict[str, torch.Tensor]) -> str:
    crc = zlib.crc32(f"{key}\0{kind}\0{fingerprint}".encode())
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()  # a CUDA chunk is checksummed on the host
        crc = zlib.crc32(name.encode(), crc)
        crc = zlib.crc32(t.view(torch.uint8).numpy().data if t.numel() else b"", crc)
    return f"{crc:08x}"


def encode(key: ChunkKey, kv: ChunkKV, encoding: str = "raw", kind: str = "",
           fingerprint: str = "") -> bytes:
    """Entry bytes for `kv` under `key`. encoding "int8" stores per-channel INT8 + scales (lossy);
    kind/fingerprint are recorded so readers can re-derive the key."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}")
    tensors: dict[str, torch.Tensor] = {"token_ids": torch.tensor(kv.token_ids, dtype=torch.int64)}
    if encoding == "int8":
        tensors["k_q"], tensors["k_scale"] = quantize_per_channel(kv.k)
        tensors["v_q"], tensors["v_scale"] = quantize_per_channel(kv.v)
    else:
        tensors["k"], tensors["v"] = kv.k.detach().contiguous(), kv.v.detach().contiguous()
    if kv.states is not None:   # raw in either encoding: the late join starts from them
        tensors["h"] = kv.states.detach().contiguous()
        tensors["h_layer"] = torch.tensor([kv.states_layer], dtype=torch.int64)
    meta = {"format": FORMAT, "key": key, "kind": kind, "fingerprint": fingerprint,
            "encoding": encoding, "dtype": str(kv.k.dtype).removeprefix("torch."),
            "checksum": _checksum(key, kind, fingerprint, tensors)}
    return safetensors.torch.save(tensors, metadata=meta)


def read_metadata(data: bytes) -> dict[str, str]:
    """The string header of an entry; raises InvalidEntry when it is not one of ours."""
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(bytes(data[8:8 + length]))
        meta = header.get("__metadata__") or {}
    except (struct.error, ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise InvalidEntry(f"unreadable header: {exc}") from None
    if meta.get("format") != FORMAT:
        raise InvalidEntry("not an rcllm KV entry")
    return meta


def decode(data: bytes, key: ChunkKey, check: KeyCheck | None = None) -> ChunkKV:
    """The ChunkKV stored in `data`, validated for a lookup of `key` (module docstring)."""
    meta = read_metadata(data)
    try:
        tensors = safetensors.torch.load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types on malformed input
        raise InvalidEntry(f"unreadable tensors: {exc}") from None
    if _checksum(meta["key"], meta["kind"], meta["fingerprint"], tensors) != meta["checksum"]:
        raise InvalidEntry("checksum mismatch")
    if meta["key"] != key:
        raise InvalidEntry("entry was stored under another key")
    token_ids = tuple(int(t) for t in tensors["token_ids"].tolist())
    if check is not None:
        if meta["fingerprint"] != check.fingerprint:
            raise InvalidEntry("entry was computed by another model (fingerprint)")
        if chunk_key(check.fingerprint, meta["kind"], token_ids) != key:
            raise InvalidEntry("token ids do not match the key")
    dtype = getattr(torch, meta["dtype"])
    if meta["encoding"] == "int8":
        k = dequantize(tensors["k_q"], tensors["k_scale"], dtype)
        v = dequantize(tensors["v_q"], tensors["v_scale"], dtype)
    else:
        k, v = tensors["k"], tensors["v"]
    if "h" in tensors:
        return ChunkKV(token_ids, k, v, tensors["h"], int(tensors["h_layer"][0]))
    return ChunkKV(token_ids, k, v)


def encode_checked(key: ChunkKey, kv: ChunkKV, encoding: str,
                   check: KeyCheck | None) -> bytes | None:
    """encode() with the kind/fingerprint a KeyCheck derives; None when the key does not match
    the token ids under the check's fingerprint (the caller refuses the put)."""
    if check is None:
        return encode(key, kv, encoding)
    kind = check.kind_of(key, kv.token_ids)
    if kind is None:
        return None
    return encode(key, kv, encoding, kind=kind, fingerprint=check.fingerprint)
