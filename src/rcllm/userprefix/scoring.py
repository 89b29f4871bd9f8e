"""Scoring C candidates after one user prefix: one batched pass vs C independent forwards.

The batched pass is the engine's selective prefill over a block layout
(`prefill.selective.continue_exact`): every candidate's suffix restarts at position N, right
after the user side; every linear layer runs once over all C suffixes together; attention gives
each suffix token the whole prefix plus its own suffix causally and never another candidate.

The readout is TALLRec's: P(" Yes") from the two-way softmax over the " Yes" / " No" logits
at each suffix's last token; only those two rows of the LM head are evaluated.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..model.transformer import Transformer
from ..prefill.scoring import yes_no_score
from ..prefill.selective import continue_exact
from .kv import PrefixKV


@torch.inference_mode()
def compute_prefix(model: Transformer, ids: Sequence[int]) -> PrefixKV:
    """The user side's KV from one causal forward (positions 0..N-1)."""
    out = model.forward(torch.tensor(list(ids), device=model.device), return_kv=True,
                        logits=False)
    return PrefixKV(out["k"], out["v"])


def suffix_last_hidden(model: Transformer, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
                       suffixes: Sequence[Sequence[int]]) -> torch.Tensor:
    """The last hidden state (before the final norm) of every suffix [C, d], each suffix
    placed right after the prefix (keys pre-RoPE, [L, H_kv, N, D]) and seeing only it and
    itself: the engine's selective prefill over a block layout. Raises ValueError for an
    empty suffix."""
    try:
        return continue_exact(model, prefix_k, prefix_v, suffixes,
                              grad=torch.is_grad_enabled() and not torch.is_inference_mode_enabled())
    except ValueError:
        raise ValueError("empty candidate suffix") from None


@torch.inference_mode()
def score_batched(model: Transformer, prefix: PrefixKV, suffixes: Sequence[Sequence[int]],
                  yes_id: int, no_id: int) -> torch.Tensor:
    """P(yes) per candidate [C] (float32, CPU) in one pass over the cached prefix.

    The prefix is not modified. Raises ValueError for an empty suffix.
    """
    h = suffix_last_hidden(model, prefix.k, prefix.v, suffixes)
    return torch.sigmoid(yes_no_score(model, model.final_hidden(h), yes_id, no_id)[0]).cpu()


@torch.inference_mode()
def score_independent(model: Transformer, prefix_ids: Sequence[int], suffix: Sequence[int],
                      yes_id: int, no_id: int) -> float:
    """The reference: P(yes) from one full forward over prefix + suffix (no cache)."""
    ids = torch.tensor(list(prefix_ids) + list(suffix), device=model.device)
    out = model.forward(ids, return_hidden=True)
    return float(torch.sigmoid(yes_no_score(model, out["hidden"], yes_id, no_id)[0]))
