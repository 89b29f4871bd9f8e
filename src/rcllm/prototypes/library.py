"""The semantic history cache: a library of token prototypes with precomputed KV.

Build (`PrototypeLibrary.build`, `rcllm build-history`): every review chunk of a corpus is run
through the model's first layer after the history chunk's template context; each token gets an
embedding of meaning + position (`embed.py`). Locality-sensitive hashing (faiss `IndexLSH`,
random rotation + sign bits) puts the tokens in buckets; each bucket keeps one prototype, the
member closest to the bucket's mean. Buckets are ranked by population and kept while the
count and byte budgets allow; then the chunks holding a prototype are run through the whole
model and the prototype tokens' KV is kept for every layer (keys pre-RoPE, built in the same
template context as exact history chunks, so it is position independent like them).

Use (`match`): a review chunk missing from the exact chunk cache gets its first-layer
embeddings, each token's nearest prototype by exact cosine (faiss `IndexFlatIP` over the
prototypes), and the prototype's KV where the cosine reaches the threshold. Tokens below it
stay fresh. The engine's selective recompute then treats matched tokens as reused history.

File format: one safetensors file (no pickle), tensors plus string metadata: the model
fingerprint and chunk-kind tag it was built for, build options, and a SHA-256 over every
tensor; `load` refuses a file whose checksum, fingerprint or kind tag does not match.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..errors import RcllmError
from ..kvstore.base import KVMatch
from ..prefill.chunks import ChunkBuilder
from .embed import embed_tokens, first_layer_states

log = logging.getLogger(__name__)
logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its CPU-feature probing is noise
FORMAT = "rcllm-history-prototypes-1"
TENSORS = ("k", "v", "emb", "token_ids", "offsets", "counts", "mean", "std", "codes", "lsh")
SEARCHES = ("lsh", "exact")


@dataclass(frozen=True)
class BuildOptions:
    nbits: int = 16                 # LSH code length: 2^nbits possible buckets
    max_prototypes: int = 16384     # most prototypes kept (largest buckets first)
    max_bytes: int = 1 << 30        # byte budget of the prototypes' KV
    position_weight: float = 0.1    # share of the offset code in the cosine (embed.py)
    dtype: str = "float16"          # storage of the prototype KV: float16 | float32
    seed: int = 0

    def validate(self) -> None:
        if not 1 <= self.nbits <= 64:
            raise RcllmError("nbits must be within 1..64")
        if self.max_prototypes < 1 or self.max_bytes < 1:
            raise RcllmError("max_prototypes and max_bytes must be positive")
        if not 0.0 <= self.position_weight < 1.0:
            raise RcllmError("position_weight must be within [0, 1)")
        if self.dtype not in ("float16", "float32"):
            raise RcllmError("dtype must be float16 or float32")


@dataclass
class Match:
    k: torch.Tensor          # [L, H_kv, T, D] prototype keys (pre-RoPE); zeros where unmatched
    v: torch.Tensor          # [L, H_kv, T, D]
    matched: torch.Tensor    # [T] bool: cosine >= threshold
    cosine: torch.Tensor     # [T] cosine to the nearest prototype
    prototype: torch.Tensor  # [T] index of the nearest prototype

    def as_match(self) -> KVMatch:
        """The engine's look-up shape: the matched tokens hold (reused) prototype KV."""
        return KVMatch("prototype", 0, self.k.shape[2], ((0, self.k, self.v),), self.matched)


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in TENSORS:
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode() + str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class PrototypeLibrary:
    def __init__(self, tensors: dict[str, torch.Tensor], meta: dict):
        self.t = tensors
        self.meta = meta
        self.fingerprint: str = meta["fingerprint"]
        self.kind_tag: str = meta["kind_tag"]
        self.position_weight = float(meta["position_weight"])
        self._flat = None        # exact search: faiss IndexFlatIP over the prototypes
        self._lsh = None         # LSH search: the build's IndexLSH and code → prototype
        self._bucket: dict[bytes, int] | None = None
        self._limit = len(tensors["emb"])

    def __len__(self) -> int:
        return self._limit

    @property
    def bytes_per_prototype(self) -> int:
        k = self.t["k"]
        return 2 * k[0].numel() * k.element_size()

    @property
    def nbytes(self) -> int:
        return len(self) * self.bytes_per_prototype

    def truncated(self, count: int) -> "PrototypeLibrary":
        """The same library restricted to its `count` most populous prototypes."""
        lib = PrototypeLibrary(self.t, self.meta)
        lib._limit = max(1, min(count, len(self)))
        return lib

    # ---- build -------------------------------------------------------------------------
    @classmethod
    def build(cls, builder: ChunkBuilder, chunks: Sequence[Sequence[int]],
              opts: BuildOptions = BuildOptions(), progress: bool = False) -> "PrototypeLibrary":
        """Builds a library from review chunks (token ids as the prompt builder makes them),
        their KV from `builder` (the engine's `chunks`)."""
        opts.validate()
        chunks = [tuple(c) for c in dict.fromkeys(tuple(c) for c in chunks) if len(c)]
        if not chunks:
            raise RcllmError("no review text to build prototypes from")
        emb, where, mean, std = _token_embeddings(builder, chunks, opts, progress)
        where_t = torch.tensor(where, dtype=torch.long)
        codes, lsh_bytes, counts, rep_of_bucket = _buckets(emb, opts)
        nb = int(counts.shape[0])
        a = builder.model.arch
        per_proto = 2 * a.num_layers * a.num_kv_heads * a.head_dim * (2 if opts.dtype == "float16" else 4)
        keep = min(opts.max_prototypes, opts.max_bytes // per_proto, nb)
        if keep < 1:
            raise RcllmError(f"max_bytes {opts.max_bytes} is below one prototype ({per_proto} B)")
        order = torch.from_numpy(np.argsort(-counts, kind="stable"))[:keep]
        protos = rep_of_bucket[order]                                   # token rows
        dtype = torch.float16 if opts.dtype == "float16" else torch.float32
        shape = (keep, a.num_layers, a.num_kv_heads, a.head_dim)
        k_out, v_out, token_ids = _prototype_kv(builder, chunks, where, protos.tolist(),
                                                torch.empty(shape, dtype=dtype), progress)
        tensors = {"k": k_out, "v": v_out, "emb": emb[protos].contiguous(),
                   "token_ids": token_ids, "offsets": where_t[protos, 1].contiguous(),
                   "counts": torch.from_numpy(counts[order.numpy()].astype(np.int64)),
                   "mean": mean, "std": std,
                   "codes": torch.from_numpy(codes[protos.numpy()].copy()), "lsh": lsh_bytes}
        meta = {"format": FORMAT, "fingerprint": builder.fingerprint,
                "kind_tag": builder.kind_tag("history"),
                "position_weight": repr(opts.position_weight), "options": json.dumps(asdict(opts)),
                "corpus_reviews": str(len(chunks)), "corpus_tokens": str(len(emb)),
                "buckets": str(nb)}
        log.info("history prototypes: %d of %d buckets from %d tokens in %d reviews",
                 keep, nb, len(emb), len(chunks))
        return cls(tensors, meta)

    # ---- files -------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {n: self.t[n].contiguous() for n in TENSORS}
        meta = {**self.meta, "checksum": _digest(tensors)}
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)  # readers never see a half-written library

    @classmethod
    def load(cls, path: str | Path, fingerprint: str | None = None,
             kind_tag: str | None = None) -> "PrototypeLibrary":
        """Loads and verifies a library; refuses a corrupt file or one built for another model
        (fingerprint) or chunk context (kind tag) with an RcllmError."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise RcllmError(f"history library not found: {path}")
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = dict(fh.metadata() or {})
                tensors = {n: fh.get_tensor(n) for n in TENSORS}
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise RcllmError(f"history library {path} is corrupt or not a library: {exc}") from None
        if meta.get("format") != FORMAT:
            raise RcllmError(f"{path} is not a history prototype library ({FORMAT})")
        if _digest(tensors) != meta.get("checksum"):
            raise RcllmError(f"history library {path} is corrupt (checksum mismatch)")
        if fingerprint is not None and meta["fingerprint"] != fingerprint:
            raise RcllmError(f"history library {path} was built with another model "
                             f"(fingerprint {meta['fingerprint'][:16]}…, this model "
                             f"{fingerprint[:16]}…); rebuild it with `rcllm build-history`")
        if kind_tag is not None and meta["kind_tag"] != kind_tag:
            raise RcllmError(f"history library {path} was built for chunk kind "
                             f"{meta['kind_tag']!r} but the engine builds {kind_tag!r} "
                             f"(reuse.chunk_context differs); rebuild it")
        return cls(tensors, meta)

    # ---- use ---------------------------------------------------------------------------
    def embed(self, builder: ChunkBuilder, ids: Sequence[int]) -> torch.Tensor:
        """Unit embeddings [T, E] of a review chunk's tokens, as the build embedded the corpus."""
        dev = builder.model.device
        states = first_layer_states(builder.model, torch.tensor(ids, device=dev),
                                    builder.context_layer0("history")).float().cpu()
        return embed_tokens(states, torch.arange(len(ids)), self.t["mean"], self.t["std"],
                            self.position_weight)

    def nearest(self, builder: ChunkBuilder, ids: Sequence[int], search: str = "lsh"
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cosine [T], prototype index [T]) of each token of a review chunk.

        "lsh": the prototype of the token's LSH bucket (one hash and a dictionary look-up per
        token; cosine -1 when the bucket kept no prototype). "exact": the nearest prototype by
        cosine over all of them (faiss IndexFlatIP), the reference the LSH look-up approximates.
        """
        return self.search(self.embed(builder, ids), search)

    def search(self, emb: torch.Tensor, search: str = "lsh") -> tuple[torch.Tensor, torch.Tensor]:
        """`nearest` for embeddings [T, E] already made by `embed`."""
        import faiss

        if search not in SEARCHES:
            raise RcllmError(f"history.search must be one of {', '.join(SEARCHES)}, not {search!r}")
        q = np.ascontiguousarray(emb.numpy())
        if search == "exact":
            if self._flat is None:
                self._flat = faiss.IndexFlatIP(q.shape[1])
                self._flat.add(np.ascontiguousarray(self.t["emb"][: len(self)].numpy()))
            sim, idx = self._flat.search(q, 1)
            return torch.from_numpy(sim[:, 0]), torch.from_numpy(idx[:, 0].astype(np.int64))
        if self._lsh is None:
            self._lsh = faiss.deserialize_index(self.t["lsh"].numpy())
            codes = self.t["codes"][: len(self)].numpy()
            self._bucket = {codes[i].tobytes(): i for i in range(len(codes))}
        found = [self._bucket.get(c.tobytes(), -1) for c in self._lsh.sa_encode(q)]
        idx = torch.tensor(found, dtype=torch.long)
        hit = idx >= 0
        idx = idx.clamp_min(0)
        cos = (torch.from_numpy(q) * self.t["emb"][idx]).sum(1)
        return torch.where(hit, cos, torch.full_like(cos, -1.0)), idx

    def match(self, builder: ChunkBuilder, ids: Sequence[int], threshold: float, search: str = "lsh") -> Match:
        cos, idx = self.nearest(builder, ids, search)
        matched = cos >= threshold
        dev, dtype = builder.model.device, builder.model.dtype
        k = self.t["k"][idx].permute(1, 2, 0, 3).to(device=dev, dtype=dtype)
        v = self.t["v"][idx].permute(1, 2, 0, 3).to(device=dev, dtype=dtype)
        k[:, :, ~matched] = 0
        v[:, :, ~matched] = 0
        return Match(k, v, matched, cos, idx)

    def describe(self) -> dict:
        return {"prototypes": len(self), "bytes": self.nbytes,
                "bytes_per_prototype": self.bytes_per_prototype,
                "corpus_reviews": int(self.meta["corpus_reviews"]),
                "corpus_tokens": int(self.meta["corpus_tokens"]),
                "buckets": int(self.meta["buckets"]),
                "options": json.loads(self.meta["options"])}


def _token_embeddings(builder: ChunkBuilder, chunks: list[tuple[int, ...]], opts: BuildOptions,
                      progress: bool):
    """Every corpus token's embedding [T, e] (its first-layer state, normalised, with its
    position code), where it sits ((chunk, offset) per token) and the states' mean and std."""
    from tqdm import tqdm

    model, dev = builder.model, builder.model.device
    ctx0 = builder.context_layer0("history")
    states, where = [], []
    for ci, ids in enumerate(tqdm(chunks, desc="first-layer states", unit="review",
                                  disable=not progress)):
        states.append(first_layer_states(model, torch.tensor(ids, device=dev), ctx0).float().cpu())
        where += [(ci, off) for off in range(len(ids))]
    allh = torch.cat(states)
    mean, std = allh.mean(0), allh.std(0).clamp_min(1e-6)
    offsets = torch.tensor([off for _, off in where], dtype=torch.long)
    return embed_tokens(allh, offsets, mean, std, opts.position_weight), where, mean, std


def _buckets(emb: torch.Tensor, opts: BuildOptions):
    """LSH buckets of the embeddings (a random rotation and one sign bit per code dimension):
    each token's code, the serialised index, each bucket's size, and its representative (the
    token closest to the bucket's centroid, the first on ties)."""
    import faiss

    lsh = faiss.IndexLSH(emb.shape[1], opts.nbits, True, False)
    rng = np.random.default_rng(opts.seed)
    sample = emb.numpy()[rng.permutation(len(emb))[: 65536]]
    lsh.train(np.ascontiguousarray(sample))
    codes = lsh.sa_encode(np.ascontiguousarray(emb.numpy()))
    lsh_bytes = torch.from_numpy(np.asarray(faiss.serialize_index(lsh), dtype=np.uint8).copy())
    _, bucket, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    bucket = torch.from_numpy(bucket.reshape(-1).astype(np.int64))
    nb = int(counts.shape[0])
    centroid = torch.zeros(nb, emb.shape[1]).index_add_(0, bucket, emb)
    centroid = centroid / centroid.norm(dim=1, keepdim=True).clamp_min(1e-12)
    score = (emb * centroid[bucket]).sum(1)
    best = torch.full((nb,), -2.0).scatter_reduce(0, bucket, score, "amax")
    is_rep = score >= best[bucket]
    rep_of_bucket = torch.full((nb,), -1, dtype=torch.long)
    rep_idx = torch.nonzero(is_rep).squeeze(1)
    rep_of_bucket[bucket[rep_idx].flip(0)] = rep_idx.flip(0)  # first member on ties
    return codes, lsh_bytes, counts, rep_of_bucket


def _prototype_kv(builder: ChunkBuilder, chunks: list[tuple[int, ...]], where: list,
                  rows: list[int], empty: torch.Tensor, progress: bool):
    """The prototypes' K and V [P, L, H_kv, D] (like `empty`) and token ids [P]: each taken
    from its review's chunk KV, one chunk pass per review that holds prototypes."""
    from tqdm import tqdm

    k_out, v_out = empty, empty.clone()
    token_ids = torch.empty(len(rows), dtype=torch.long)
    by_chunk: dict[int, list[tuple[int, int]]] = {}
    for slot, row in enumerate(rows):
        ci, off = where[row]
        by_chunk.setdefault(ci, []).append((slot, off))
        token_ids[slot] = chunks[ci][off]
    for ci, members in tqdm(sorted(by_chunk.items()), desc="prototype KV", unit="review",
                            disable=not progress):
        kv = builder.compute("history", chunks[ci])
        slots = torch.tensor([s for s, _ in members])
        offs = torch.tensor([o for _, o in members])
        k_out[slots] = kv.k[:, :, offs].permute(2, 0, 1, 3).to(empty.dtype).cpu()
        v_out[slots] = kv.v[:, :, offs].permute(2, 0, 1, 3).to(empty.dtype).cpu()
    return k_out, v_out, token_ids
