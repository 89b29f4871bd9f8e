"""Position-independent chunk KV: built after a short context, keyed, stored and built once.

A chunk (one item text, one review) is run through the model after the tokens of its *context*
(`reuse.chunk_context`): "none" (the chunk alone), "instruction" (the instruction prefix) or
"template" (the instruction followed by the dynamic text that precedes such a chunk in a prompt:
the items header and a label, or the pointwise block head; a history entry's bullet), so the
chunk's first tokens see a realistic neighbourhood instead of acting as attention sinks. The
context is part of the key (`kind_tag`): KV built after one context never serves another.
Keys are stored pre-RoPE, so the same entry serves the chunk at any position.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from typing import Callable, Sequence

import torch

from ..config import ReuseConfig
from ..kvstore.base import ChunkKV, KVStore, chunk_key
from ..model.transformer import Transformer

CHUNK_KINDS = ("history", "item")
STATES_KEPT = 65536  # entering states kept beside the store (Magazine: 37 KB a chunk)


class ChunkBuilder:
    """Builds and keys the chunk KV of one model. `context_ids(kind)` gives the tokens a chunk
    of `kind` is built after under the "template" context ("instruction": the instruction);
    `reuse` is the engine's configured reuse section (the default of every call)."""

    def __init__(self, model: Transformer, fingerprint: str,
                 context_ids: Callable[[str], Sequence[int]], reuse: ReuseConfig,
                 store: KVStore):
        self.model, self.fingerprint, self.reuse, self.store = model, fingerprint, reuse, store
        self._context_ids = context_ids
        # (kind, mode) → K, V [L, H_kv, P, D] of the context, and its tag
        self._contexts: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor, str]] = {}
        # (computed, context tokens, ms) of the latest builds, on whichever thread ran them: what
        # a build costs, for the simulator's price of the work behind an answer
        self.timings: deque = deque(maxlen=4096)
        self._states: dict = {}  # (chunk key, layer) → states kept beside the store
        self._states_lock = threading.Lock()

    def context(self, kind: str, mode: str):
        """(K, V, tag) of the tokens a chunk of `kind` is built after, or None for "none"."""
        if mode == "none":
            return None
        if (kind, mode) not in self._contexts:
            ids = list(self._context_ids("instruction" if mode == "instruction" else kind))
            out = self.model.forward(torch.tensor(ids, device=self.model.device), return_kv=True,
                                     logits=False)
            tag = hashlib.sha256(repr(ids).encode()).hexdigest()[:12]
            self._contexts[(kind, mode)] = (out["k"], out["v"], tag)
        return self._contexts[(kind, mode)]

    @torch.inference_mode()
    def states(self, kind: str, ids: Sequence[int], layer: int,
               reuse: ReuseConfig | None = None) -> torch.Tensor:
        """[len(ids), d]: the chunk's hidden states entering `layer` in the pass that builds its
        KV (after its kind's context): the `late` method starts the chunk's tokens there in a
        prompt. A build for `late` carries them on its entry (`ChunkKV.states`, through every
        tier); a build for another method keeps them here, per chunk and layer (up to
        STATES_KEPT; the oldest go first); an entry without either (another depth, another
        process's build) has them recomputed and kept here."""
        key = (self.key(kind, ids, reuse), layer)
        with self._states_lock:
            got = self._states.get(key)
        if got is not None:
            return got
        from .selective import block_states

        ctx = self.context(kind, (reuse or self.reuse).chunk_context)
        a, dev = self.model.arch, self.model.device
        k, v = (ctx[0], ctx[1]) if ctx else (
            torch.zeros(a.num_layers, a.num_kv_heads, 0, a.head_dim, dtype=self.model.dtype,
                        device=dev),) * 2
        h = block_states(self.model, k, v, [list(ids)], layer)[0]
        self._keep_state(key[0], layer, h)
        return h

    def context_len(self, kind: str, reuse: ReuseConfig | None = None) -> int:
        """How many tokens a chunk of `kind` is built after (0 for the "none" context)."""
        ctx = self.context(kind, (reuse or self.reuse).chunk_context)
        return int(ctx[0].shape[-2]) if ctx else 0

    def kind_tag(self, kind: str, reuse: ReuseConfig | None = None) -> str:
        """The tag chunks of `kind` are keyed under (kind + the context they are built after)."""
        ctx = self.context(kind, (reuse or self.reuse).chunk_context)
        return f"{kind}@{ctx[2] if ctx else 'none'}"

    def context_layer0(self, kind: str):
        """Layer-0 (K, V) [H_kv, P, D] of the context chunks of `kind` are built after, or None."""
        ctx = self.context(kind, self.reuse.chunk_context)
        return (ctx[0][0], ctx[1][0]) if ctx else None

    def key(self, kind: str, ids: Sequence[int], reuse: ReuseConfig | None = None):
        return chunk_key(self.fingerprint, self.kind_tag(kind, reuse), ids)

    @torch.inference_mode()
    def compute(self, kind: str, ids: Sequence[int], reuse: ReuseConfig | None = None) -> ChunkKV:
        """Position-independent KV of a chunk, built after its kind's context (keys pre-RoPE)."""
        ctx = self.context(kind, (reuse or self.reuse).chunk_context)
        t0 = time.perf_counter()
        layer = self._late_layer(kind, reuse)
        if layer is not None and ctx is not None:
            # an item's KV and its states entering the late layer, in the same pass
            from .selective import blocks_kv

            states: list = []
            (k, v), = blocks_kv(self.model, ctx[0], ctx[1], [list(ids)], layer, states)
            self._timed(len(ids), kind, reuse, t0)
            return self._entry(kind, ids, reuse, k, v, states[0], layer)
        t = torch.tensor(ids, device=self.model.device)
        out = self.model.forward(t, ctx[0] if ctx else None, ctx[1] if ctx else None,
                                 return_kv=True, logits=False)
        self._timed(len(ids), kind, reuse, t0)
        return ChunkKV(tuple(ids), out["k"], out["v"])

    def _late_layer(self, kind: str, reuse: ReuseConfig | None) -> int | None:
        """The layer whose entering states an item build also computes (`reuse.late_layer`,
        when it is inside the model), else None."""
        layer = (reuse or self.reuse).late_layer
        return layer if kind == "item" and 0 < layer < self.model.arch.num_layers else None

    def _entry(self, kind: str, ids: Sequence[int], reuse: ReuseConfig | None, k, v,
               h: torch.Tensor, layer: int) -> ChunkKV:
        """A built item's entry: a build for `late` carries its states (through every tier);
        another method's keeps them beside the store in this process (`states`), so its
        byte budget holds KV only and a later `late` request still finds them."""
        if (reuse or self.reuse).method == "late":
            return ChunkKV(tuple(ids), k, v, h, layer)
        self._keep_state(self.key(kind, ids, reuse), layer, h)
        return ChunkKV(tuple(ids), k, v)

    def _keep_state(self, key, layer: int, h: torch.Tensor) -> None:
        with self._states_lock:
            self._states[(key, layer)] = h
            while len(self._states) > STATES_KEPT:
                self._states.pop(next(iter(self._states)))

    def _timed(self, computed: int, kind: str, reuse: ReuseConfig | None, t0: float) -> None:
        """Records a build of `computed` tokens that started at perf_counter `t0`."""
        self.timings.append((computed, computed + self.context_len(kind, reuse),
                             (time.perf_counter() - t0) * 1e3))

    def ensure(self, kind: str, ids: Sequence[int], reuse: ReuseConfig | None = None) -> bool:
        """Builds and stores the chunk if absent; True when this call built it. A build of the
        same key in flight on the store is joined, not repeated (`KVStore.build_now`)."""
        key = self.key(kind, ids, reuse)
        if self.store.contains(key):
            return False
        return self.store.build_now(key, lambda: self.compute(kind, ids, reuse))

    @torch.inference_mode()
    def compute_many(self, kind: str, chunks: Sequence[Sequence[int]],
                     reuse: ReuseConfig | None = None) -> list[ChunkKV]:
        """`compute` of several chunks of one kind in one pass (each after the kind's context,
        seeing it and itself: `prefill.selective.blocks_kv`), so a build's fixed cost — reading
        every layer's weights — is paid once for all of them. Equal to `compute` of each up to
        float rounding."""
        from .selective import blocks_kv

        ctx = self.context(kind, (reuse or self.reuse).chunk_context)
        if ctx is None or len(chunks) == 1:
            return [self.compute(kind, ids, reuse) for ids in chunks]
        t0 = time.perf_counter()
        layer, states = self._late_layer(kind, reuse), []
        kv = blocks_kv(self.model, ctx[0], ctx[1], chunks, layer, states)
        self._timed(sum(len(ids) for ids in chunks), kind, reuse, t0)
        if layer is None:
            return [ChunkKV(tuple(ids), k, v) for ids, (k, v) in zip(chunks, kv)]
        return [self._entry(kind, ids, reuse, k, v, h, layer)
                for ids, (k, v), h in zip(chunks, kv, states)]

    def build_behind(self, misses: Sequence[tuple[str, Sequence[int]]], reuse: ReuseConfig
                     ) -> list[tuple[int, int]]:
        """A request's misses, after its answer: each queued on the store's builder (once per
        key: `KVStore.build_behind` counts the miss and skips a key stored or in flight), and
        the queued ones of a kind built together in one pass (`compute_many`) by whichever of
        their jobs runs first. Returns (computed, context) tokens per kind with a queued build
        — one job each, as the builder runs it."""
        out = []
        for kind in dict.fromkeys(k for k, _ in misses):
            batch = _Batch(self, kind, reuse)
            queued = []
            chunks = [ids for k, ids in misses if k == kind]
            for ids in chunks:   # all before the first job is queued: the builder may run it
                batch.add(ids)   # at once, and it builds every chunk wanted by then
            for ids in chunks:
                if self.store.build_behind(self.key(kind, ids, reuse), kind,
                                           lambda ids=ids, batch=batch: batch.take(ids)):
                    queued.append(len(ids))
                else:
                    batch.discard(ids)
            if queued:
                out.append((sum(queued), sum(queued) + self.context_len(kind, reuse)))
        return out

    def build(self, kind: str, chunks: Sequence[Sequence[int]], progress: bool = False) -> int:
        """Ensures every chunk of `kind` is stored; returns how many were built."""
        from tqdm import tqdm

        bar = tqdm(chunks, desc=f"building {kind} KV", unit="chunk", disable=not progress)
        return sum(self.ensure(kind, ids) for ids in bar)


class _Batch:
    """The chunks of one kind a request queued behind its answer: the first of their jobs to
    run builds every one still wanted in one pass; the others take their result."""

    def __init__(self, builder: ChunkBuilder, kind: str, reuse: ReuseConfig):
        self.builder, self.kind, self.reuse = builder, kind, reuse
        self._wanted: list[tuple[int, ...]] = []
        self._built: dict[tuple[int, ...], ChunkKV] = {}
        self._lock = threading.Lock()

    def add(self, ids: Sequence[int]) -> None:
        with self._lock:
            self._wanted.append(tuple(ids))

    def discard(self, ids: Sequence[int]) -> None:
        """`ids` will not be taken (its job was not queued): not wanted, not kept."""
        with self._lock:
            if tuple(ids) in self._wanted:
                self._wanted.remove(tuple(ids))
            self._built.pop(tuple(ids), None)

    def take(self, ids: Sequence[int]) -> ChunkKV:
        """`ids`'s KV, building every wanted chunk not built yet in one pass. The pass runs
        outside the lock, so a request thread adding or discarding (it holds its engine) never
        waits for a build; jobs run one at a time on the store's builder thread."""
        key = tuple(ids)
        with self._lock:
            todo = ([] if key in self._built else
                    [c for c in dict.fromkeys(self._wanted + [key]) if c not in self._built])
        if todo:
            kvs = self.builder.compute_many(self.kind, todo, self.reuse)
            with self._lock:
                for c, kv in zip(todo, kvs):
                    self._built.setdefault(c, kv)
        with self._lock:
            if key in self._wanted:
                self._wanted.remove(key)
            return self._built.pop(key)
