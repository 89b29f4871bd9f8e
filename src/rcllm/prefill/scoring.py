"""Turning a prefilled prompt into candidate scores.

- verbalizer (LlamaRec): log-softmax over the candidate label tokens at the last position.
- pointwise (TALLRec): the " Yes" − " No" logit at each candidate block's last slot
  (`yes_no_score`: the one place it is computed; the engine's scorer, the user-prefix library
  (P(yes) = sigmoid of it) and the trainer's paths all call it, so training and serving
  cannot score apart).
- likelihood: mean log-probability of each candidate's name as the continuation of the
  prompt. All continuations run in one pass of the selective prefill over the shared prompt
  KV (`continue_exact`, a block layout): each continuation token attends to every prompt token
  and causally to its own continuation only, never to the other candidates.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..model.transformer import Transformer
from .selective import continue_exact


def yes_no_logits(model: Transformer, normed: torch.Tensor, yes_id: int, no_id: int
                  ) -> torch.Tensor:
    """Final-normed hidden states [C, d] → the (yes, no) logits [C, 2] (float32); only those
    two rows of the output head are evaluated. The score is column 0 − column 1."""
    return F.linear(normed, model.lm_head[[yes_id, no_id]]).float()


def yes_no_score(model: Transformer, normed: torch.Tensor, yes_id: int, no_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Final-normed hidden states [C, d] (or [d]) → (score = the " Yes" − " No" logit [C]
    (or []), the (yes, no) logits [C, 2] (or [2]))."""
    logits = yes_no_logits(model, normed, yes_id, no_id)
    return logits[..., 0] - logits[..., 1], logits


def verbalizer_scores(logits: torch.Tensor, label_ids: Sequence[int]) -> torch.Tensor:
    return torch.log_softmax(logits[list(label_ids)], dim=-1)


@torch.inference_mode()
def continuation_scores(model: Transformer, k_buf: torch.Tensor, v_buf: torch.Tensor,
                        last_logits: torch.Tensor, continuations: Sequence[Sequence[int]]
                        ) -> torch.Tensor:
    """Mean log p(continuation | prompt) per candidate: [C].

    k_buf/v_buf: [L, H_kv, N, D] the prompt's KV (pre-RoPE keys); last_logits: [V] at N-1.
    """
    if any(len(c) == 0 for c in continuations):
        raise ValueError("empty continuation")
    first = torch.log_softmax(last_logits, dim=-1)
    total = torch.tensor([float(first[c[0]]) for c in continuations])
    rest = [c for c in continuations if len(c) > 1]
    if rest:
        h = continue_exact(model, k_buf, v_buf, [c[:-1] for c in rest], every_slot=True)
        logp = torch.log_softmax(model.logits(h), dim=-1)
        targets = torch.tensor([t for c in rest for t in c[1:]])
        owner = torch.tensor([i for i, c in enumerate(continuations) if len(c) > 1
                              for _ in c[1:]])
        tok_lp = logp[torch.arange(len(targets)), targets]
        total = total.index_add(0, owner, tok_lp.float().cpu())
    lengths = torch.tensor([float(len(c)) for c in continuations])
    return total / lengths
