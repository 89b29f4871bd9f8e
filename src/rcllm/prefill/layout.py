"""Where the selective prefill's KV slots sit and what each sees (`Layout`), and attention of
a set of query slots under it (`attend_layout`).

The listwise prompt is one causal sequence. The pointwise prompt is a shared part (the user
side) followed by C candidate blocks that all start right after it, each seeing the shared part
and itself, never another block; each block's last slot is an output.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..model.transformer import Transformer

GROUP_SLOTS = 1024  # block attention runs over groups of whole blocks of at most this many slots


class Layout:
    """Positions and visibility of N KV slots.

    Slots [0, shared) form one causal sequence at positions 0..shared-1. Each block (a slot
    range after the shared part) restarts at position `shared` and sees the shared part plus
    itself causally. `outputs` are the slots whose hidden states the prefill returns (sorted;
    default: each block's last slot, or the last slot).
    """

    def __init__(self, n: int, blocks: Sequence[tuple[int, int]] = (), device=None,
                 outputs: torch.Tensor | None = None):
        self.n = n
        self.blocks = list(blocks)
        self.shared = self.blocks[0][0] if self.blocks else n
        pos = torch.arange(n, device=device)
        block = torch.zeros(n, dtype=torch.long, device=device)
        prev = self.shared
        for b, (s, e) in enumerate(self.blocks, start=1):
            if s != prev or e <= s:
                raise ValueError("blocks must be consecutive, non-empty and end the layout")
            pos[s:e] = torch.arange(self.shared, self.shared + e - s, device=device)
            block[s:e] = b
            prev = e
        if prev != n:
            raise ValueError("blocks must cover the slots after the shared part")
        self.pos, self.block = pos, block
        if outputs is None:
            outputs = (torch.tensor([e - 1 for _, e in self.blocks], device=device)
                       if self.blocks else torch.tensor([n - 1], device=device))
        self.outputs = outputs
        self._groups: list[tuple[int, int]] = []
        for s, e in self.blocks:  # consecutive whole blocks of <= GROUP_SLOTS slots
            if self._groups and e - self._groups[-1][0] <= GROUP_SLOTS:
                self._groups[-1] = (self._groups[-1][0], e)
            else:
                self._groups.append((s, e))

    @staticmethod
    def causal(n: int, device=None) -> "Layout":
        return Layout(n, (), device)

    @staticmethod
    def after(shared: int, lengths: Sequence[int], device=None, every_slot: bool = False
              ) -> "Layout":
        """A shared part of `shared` slots, then one block per length; outputs: each block's
        last slot, or with every_slot all block slots."""
        blocks, at = [], shared
        for k in lengths:
            blocks.append((at, at + k))
            at += k
        outputs = torch.arange(shared, at, device=device) if every_slot else None
        return Layout(at, blocks, device, outputs)

    def visible(self, q_slots: torch.Tensor) -> torch.Tensor:
        """[len(q_slots), N] bool: which slots each query slot attends to."""
        qp, qb = self.pos[q_slots].unsqueeze(1), self.block[q_slots].unsqueeze(1)
        return (self.pos.unsqueeze(0) <= qp) & ((self.block.unsqueeze(0) == 0)
                                                | (self.block.unsqueeze(0) == qb))

    def plan(self, idx: torch.Tensor) -> list[tuple[int, int, int, int, torch.Tensor | None]]:
        """How queries at slots `idx` (sorted) attend: (query from, to, key slots from, to,
        mask) per call; mask None = the shared part's causal attention."""
        out = []
        cut = int(torch.searchsorted(idx, torch.tensor(self.shared, device=idx.device)))
        if cut:
            out.append((0, cut, 0, self.shared, None))
        for s, e in self._groups:
            a = int(torch.searchsorted(idx, torch.tensor(s, device=idx.device)))
            b = int(torch.searchsorted(idx, torch.tensor(e, device=idx.device)))
            if b > a:
                q = idx[a:b]
                keys = torch.cat((torch.arange(self.shared, device=idx.device),
                                  torch.arange(s, e, device=idx.device)))
                mask = ((self.pos[keys].unsqueeze(0) <= self.pos[q].unsqueeze(1))
                        & ((self.block[keys].unsqueeze(0) == 0)
                           | (self.block[keys].unsqueeze(0) == self.block[q].unsqueeze(1))))
                out.append((a, b, s, e, mask))
        return out


def attend_layout(model: Transformer, q_rot: torch.Tensor, idx: torch.Tensor,
                  k_rot: torch.Tensor, v: torch.Tensor, layout: Layout, plan) -> torch.Tensor:
    """Attention of the queries at slots idx [n] (rotated [H, n, D]) over every slot's rotated
    keys / values [H_kv, N, D] as the layout allows. Returns [H, n, D]."""
    if not layout.blocks:
        return model.attend(q_rot, idx, k_rot, v)
    gqa = model.arch.num_heads != model.arch.num_kv_heads
    parts = []
    for a, b, s, e, mask in plan:
        if mask is None:
            parts.append(model.attend(q_rot[:, a:b], idx[a:b], k_rot[:, :e], v[:, :e]))
            continue
        keys = torch.cat((k_rot[:, :layout.shared], k_rot[:, s:e]), dim=1)
        vals = torch.cat((v[:, :layout.shared], v[:, s:e]), dim=1)
        parts.append(torch.nn.functional.scaled_dot_product_attention(
            q_rot[:, a:b].unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0), attn_mask=mask,
            enable_gqa=gqa).squeeze(0))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
