"""The choice's paths scored with what they share computed once (`choice`, issue 61).

`diagnose.Diagnoser` scores a request on each path in a pass of its own: per request, the
isolated chunk pass once per late depth, and one prompt pass per path, each with the user side
again. The paths share most of that work, and `SharedPaths` does it once:

- the isolated chunk pass (instruction + block head + each chunk) is a function of the chunk's
  tokens alone, and validation requests share most of their candidates (popularity
  negatives): it runs once per distinct chunk over the whole choice, recording in one pass
  the chunk's KV at every layer and its states entering every late depth (`_Taps`), kept
  within a byte budget (a chunk that does not fit is computed again when it recurs);
- the user side is computed once, in the full path's pass; every other path's pass takes its
  KV as exact (never recomputed), and computes only its own blocks. (One pass holding every
  path's blocks after the user side would score the same, but each block's attention runs over
  a group of up to `prefill.layout.GROUP_SLOTS` slots, so larger passes attend over more masked
  keys; a pass per path keeps the groups as small as the exhaustive scoring's.)

The scores equal the Diagnoser's up to float rounding (tests/finetune/test_ft_choice.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..config import ReuseConfig
from ..prefill.selection import SelectionPolicy
from ..prefill.selective import PrefillInputs, prefill
from ..prompt.builder import RankRequest
from .diagnose import Diagnoser, Given, block_marks
from .itemstates import Budget
from .paths import overlap_policy


@dataclass
class Isolated:
    """One item chunk's isolated pass: K and V per layer ([kv_heads, n, head_dim] each) and
    the states entering each late depth ([n, d])."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    h: dict[int, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v, *self.h.values()))


class _Taps:
    """The model, recording the hidden states entering the layers in `layers` (`prefill`
    captures one layer; the chunk pass needs one per depth). Only for a pass that computes
    every slot at every layer (a probe-free pass over fresh slots): row i is then slot i."""

    def __init__(self, model, layers: Sequence[int]):
        self._model, self._layers = model, set(layers)
        self.h: dict[int, torch.Tensor] = {}

    def __getattr__(self, name):
        return getattr(self._model, name)

    def layer(self, layer: int, h: torch.Tensor, *args, **kwargs):
        if layer in self._layers:
            self.h[layer] = h
        return self._model.layer(layer, h, *args, **kwargs)


class IsolatedChunks:
    """Per item chunk (its tokens), its isolated pass (`Isolated`), computed in one pass over
    the chunks not held and kept while `budget` allows."""

    def __init__(self, model, context: Sequence[int], depths: Sequence[int],
                 make_inputs: Callable[[list[int], list[tuple[int, int]]], PrefillInputs],
                 budget: Budget):
        self.model, self.context, self.depths = model, list(context), tuple(depths)
        self.make_inputs, self.budget = make_inputs, budget
        self.held: dict[tuple[int, ...], Isolated] = {}
        self.computed = 0       # chunks run through the pass (misses)
        self._naive = SelectionPolicy(ReuseConfig(method="naive"))

    def get(self, chunks: Sequence[Sequence[int]]) -> list[Isolated]:
        keys = [tuple(ch) for ch in chunks]
        missing = sorted({k for k in keys if k not in self.held})
        fresh = self._compute(missing) if missing else {}
        for k, st in fresh.items():
            if self.budget.take(st.nbytes):
                self.held[k] = st
        return [self.held.get(k) or fresh[k] for k in keys]

    def _compute(self, missing: list[tuple[int, ...]]) -> dict[tuple[int, ...], Isolated]:
        ids, ranges = list(self.context), []
        for toks in missing:
            ranges.append((len(ids), len(ids) + len(toks)))
            ids += toks
        inp = self.make_inputs(ids, ranges)
        taps = _Taps(self.model, self.depths)
        prefill(taps, inp, self._naive)
        self.computed += len(missing)
        return {key: Isolated([k[:, s:e].clone() for k in inp.k_buf],
                              [v[:, s:e].clone() for v in inp.v_buf],
                              {d: h[s:e].clone() for d, h in taps.h.items()})
                for key, (s, e) in zip(missing, ranges)}


class SharedPaths(Diagnoser):
    """The Diagnoser's full, fast, late@s and overlap@r scores (`score_case(case, None,
    only=...)`), with the shared work done once (module docstring). `cache_bytes`: the
    memory for the chunks' isolated passes."""

    def __init__(self, model, pw, tail: int, depths: Sequence[int] = (),
                 ratios: Sequence[float] = (), fill: str = "order", cache_bytes: int = 0):
        super().__init__(model, pw, tail, depths, ratios, fill)
        L = model.arch.num_layers
        self.chunks = IsolatedChunks(model, self._chunk_context(),
                                     [s for s in self.depths if 0 < s < L], self._inputs,
                                     Budget(cache_bytes))

    def _score_some(self, case, only: set) -> dict[str, np.ndarray]:
        cands = tuple(case.candidates)
        chunks = [list(self.pw.builder.item_chunk(c)) for c in cands]
        prompt = self.pw.prompt(RankRequest(case.user_id, case.history, cands[:1]))
        tail, shared = list(prompt.blocks[0][1].token_ids), list(prompt.token_ids)
        iso = self.chunks.get(chunks)
        fast = [self._part(st, len(ch) - min(self.tail, len(ch))) for st, ch in zip(iso, chunks)]
        given = {"full": [None] * len(chunks), "fast": fast}
        L = self.model.arch.num_layers
        for s in self.depths:
            if f"late@{s}" in only:
                given[f"late@{s}"] = [None if s <= 0 else
                                      self._part(st, len(ch), s if s < L else None)
                                      for st, ch in zip(iso, chunks)]
        user: list = []         # the first pass (full's) computes it, the others reuse it
        out = {p: self._run(shared, chunks, tail, g, user=user) for p, g in given.items()
               if p == "full" or p in only}
        for r in self.ratios:
            if f"overlap@{r:g}" in only:
                out[f"overlap@{r:g}"] = self._run(
                    shared, chunks, tail, fast, policy=overlap_policy(r, self.fill),
                    slot_marks=block_marks(prompt, chunks, tail), user=user)
        return out

    @staticmethod
    def _part(st: Isolated, n: int, join: int | None = None) -> Given | None:
        """The chunk's first n tokens as given KV; with `join`, computed from that layer up."""
        if n <= 0:
            return None
        return Given([k[:, :n] for k in st.k], [v[:, :n] for v in st.v], join,
                     st.h[join][:n] if join is not None else None)
