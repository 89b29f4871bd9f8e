"""Capturing checkpoints along a prefix and resuming a request from the deepest one.

The serving flow of PAPERS.md §3: when a prefix is first prefilled, snapshot the recurrent
state at the planned positions into the store; a later request that shares the first t tokens
loads the deepest snapshot ℓ <= t and replays only tokens ℓ..t.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import RcllmError
from .model import RecurrentLM, RecurrentState
from .store import CheckpointStore, PrefixId


@dataclass(frozen=True)
class Resumed:
    state: RecurrentState   # the state after `depth` tokens, equal to a full prefill's
    resumed_from: int       # ℓ: the checkpoint used (0 = the zero state, nothing stored <= depth)
    hidden: torch.Tensor    # [depth − ℓ, d_model]: outputs of the replayed tokens

    @property
    def replayed_tokens(self) -> int:
        return self.state.position - self.resumed_from


def capture(model: RecurrentLM, store: CheckpointStore, prefix: PrefixId, tokens: torch.Tensor,
            positions: Sequence[int]) -> RecurrentState:
    """Prefills `tokens` once, storing the state at each position in 1..len(tokens).

    Returns the state after the whole prefix. Positions outside the prefix raise RcllmError.
    """
    n = tokens.numel()
    if any(not 1 <= p <= n for p in positions):
        raise RcllmError(f"checkpoint positions must lie in 1..{n}")
    result = model.prefill(tokens, stops=positions)
    for pos in sorted(result.snapshots):
        store.put(prefix, result.snapshots[pos])
    return result.state


def resume(model: RecurrentLM, store: CheckpointStore, prefix: PrefixId, tokens: torch.Tensor,
           depth: int) -> Resumed:
    """The state after tokens[:depth], starting from the deepest stored checkpoint <= depth.

    `tokens` must hold at least `depth` tokens (the request's, which agree with the prefix up to
    depth). The stored snapshot is cloned (the load), never modified.
    """
    if not 0 <= depth <= tokens.numel():
        raise RcllmError(f"depth must lie in 0..{tokens.numel()}, got {depth}")
    snap = store.deepest(prefix, depth)
    start = snap.clone() if snap is not None else model.zero_state()
    if start.position == depth:
        return Resumed(start, depth, torch.zeros(0, model.cfg.d_model))
    out = model.prefill(tokens[start.position:depth], start)
    return Resumed(out.state, start.position, out.hidden)
