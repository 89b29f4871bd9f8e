"""The isolated chunk pass's states, per item chunk, below a layer whose weights never change.

The reuse path takes each item chunk's KV from a pass where the chunk sees only the instruction
and the block head (what the chunk store holds). Below the first adapted layer (LoRA from
`lora.first_layer` on), or below the late layer of the late path when that is lower, that
pass's weights never change, and every chunk of it restarts at the same position after the
same context: a chunk's KV there and its hidden states entering that layer are a function of
its tokens alone. So they are computed the first time the chunk appears in any prompt, in one
pass without a gradient over the chunks not yet held, and read in every later prompt, epoch
and validation; the layers from there on are computed per prompt (with the graph, where they
train). Exact: the same
scores and gradients as a whole chunk pass (tests/finetune/test_ft_itemstates.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..config import ReuseConfig
from ..prefill.selection import SelectionPolicy
from ..prefill.selective import PrefillInputs, prefill


@dataclass
class ChunkStates:
    """One isolated run of tokens below `layer`: K and V per layer ([kv_heads, n, head_dim]
    each) and the hidden states entering `layer` ([n, d])."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    h: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v, self.h))


class Budget:
    """Bytes shared by the frozen layers' caches (`train.frozen_cache_gb`)."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True


class ItemStates:
    """Per item chunk (its tokens), the isolated chunk pass's states below `layer`; the
    context's (instruction + block head) once. `budget` None keeps nothing: every call
    computes (what a scorer without a frozen layer does)."""

    def __init__(self, model, context: Sequence[int], layer: int,
                 make_inputs: Callable[[list[int], list[tuple[int, int]]], PrefillInputs],
                 budget: Budget | None):
        self.model, self.context, self.layer = model, list(context), layer
        self.make_inputs, self.budget = make_inputs, budget
        self.ctx: ChunkStates | None = None
        self.held: dict[tuple[int, ...], ChunkStates] = {}
        self.hits = self.misses = 0
        self._naive = SelectionPolicy(ReuseConfig(method="naive"))

    def get(self, chunks: dict[int, list[int]]
            ) -> tuple[ChunkStates, dict[int, ChunkStates]]:
        """The context's states and each chunk's (key: the caller's chunk index)."""
        keys = {c: tuple(toks) for c, toks in chunks.items()}
        new = [k for k in keys.values() if k not in self.held]
        self.misses += len(new)
        self.hits += len(keys) - len(new)
        missing = sorted(set(new))
        fresh: dict[tuple[int, ...], ChunkStates] = {}
        if missing or self.ctx is None:
            ctx, fresh = self._compute(missing)
            if self.ctx is None and self._keep(ctx):
                self.ctx = ctx
            for k, st in fresh.items():
                if self._keep(st):
                    self.held[k] = st
        else:
            ctx = self.ctx
        return ctx, {c: self.held.get(k) or fresh[k] for c, k in keys.items()}

    def _keep(self, st: ChunkStates) -> bool:
        return self.budget is not None and self.budget.take(st.nbytes)

    def _compute(self, missing: list[tuple[int, ...]]
                 ) -> tuple[ChunkStates, dict[tuple[int, ...], ChunkStates]]:
        """One pass over the context and the missing chunks (each its own block), no gradient
        (the layers below `layer` never train); the slices of its buffers per run."""
        ids, ranges = list(self.context), []
        for toks in missing:
            ranges.append((len(ids), len(ids) + len(toks)))
            ids += toks
        inp = self.make_inputs(ids, ranges)
        with torch.no_grad():   # grad=True only for per-layer buffers, as the training pass
            res = prefill(self.model, inp, self._naive, grad=True, capture=self.layer)
        idx = res.frozen.idx

        def run(s: int, e: int) -> ChunkStates:
            rows = torch.searchsorted(idx, torch.arange(s, e, device=idx.device))
            return ChunkStates([inp.k_buf[lay][:, s:e].clone() for lay in range(self.layer)],
                               [inp.v_buf[lay][:, s:e].clone() for lay in range(self.layer)],
                               res.frozen.h[rows].clone())

        return run(0, len(self.context)), {k: run(s, e) for k, (s, e) in zip(missing, ranges)}
