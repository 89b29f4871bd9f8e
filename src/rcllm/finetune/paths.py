"""Candidate scores of one ranking prompt on the full path, the reuse path, or both at once.

- full: the engine's pointwise prompt (user side, then one block per candidate, "Will I like
  <item chunk>? Answer:") computed whole; what `rcllm eval --methods full` ranks by.
- reuse: each item chunk's KV comes from a pass where the chunk sees only its template context
  (instruction + block head) and itself — what the chunk store holds — except its last `tail`
  tokens, which are computed in the prompt, seeing the user side (`reuse.item_tail`); the rest of
  the prompt is computed over that KV: what the engine's naive reuse with that item tail and the
  user side exact serves.

Both go through the engine's own selective prefill (`prefill(..., grad=True)`) and read the
score with `prefill.scoring.yes_no_logits`. When both paths are asked for, one pass holds the
user side once and 2·C blocks after it (C full blocks, C reuse blocks): every block sees the user
side and itself only, so each score equals the one a separate pass gives (a test pins both to
the engine), while the user side is computed once. The chunk pass skips each chunk's last `tail`
tokens (they are recomputed in the prompt anyway), which changes nothing else: within a chunk
attention is causal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ReuseConfig
from ..prefill.scoring import yes_no_logits
from ..prefill.selection import SelectionPolicy
from ..prefill.selective import Layout, PrefillInputs, prefill
from ..prompt.builder import RankRequest
from ..records import HistoryEntry, ItemId, UserId

PATHS = ("full", "reuse")


@dataclass
class PathScores:
    """Per path asked for: scores [C] (yes − no log-odds) and the final-normed hidden states at
    the answer slots [C, d] (for a hidden-state match)."""

    scores: dict[str, torch.Tensor]
    hidden: dict[str, torch.Tensor]


class PathScorer:
    """Scores candidates on the paths asked for; mutates nothing but the model's autograd graph.
    `pw` is the engine's PointwisePrompt, `tail` the item tail of the reuse path."""

    def __init__(self, model, pw, tail: int):
        self.model, self.pw, self.tail = model, pw, tail
        self._naive = SelectionPolicy(ReuseConfig(method="naive"))  # compute what is not given

    def score(self, user_id: UserId, history: tuple[HistoryEntry, ...],
              candidates: tuple[ItemId, ...], paths: tuple[str, ...]) -> PathScores:
        prompt = self.pw.prompt(RankRequest(user_id, history, candidates))
        # (item chunk, "? Answer:") of each block: PointwisePrompt's block layout
        blocks = [(list(item.token_ids), list(tail.token_ids)) for item, tail in prompt.blocks]
        ids, ranges, reused = list(prompt.token_ids), [], []  # reused: (slot range, chunk index)
        for path in paths:
            for c, (chunk, tail) in enumerate(blocks):
                s = len(ids)
                ids += chunk + tail
                ranges.append((s, len(ids)))
                keep = len(chunk) - min(self.tail, len(chunk))
                if path == "reuse" and keep:
                    reused.append(((s, s + keep), c))
        inp = self._inputs(ids, ranges)
        if reused:
            self._fill_from_chunks(inp, blocks, reused)
        res = prefill(self.model, inp, self._naive, grad=True)
        h = self.model.final_hidden(res.hidden_out)              # [P·C, d]
        logits = yes_no_logits(self.model, h, self.pw.yes_id, self.pw.no_id)
        s = logits[:, 0] - logits[:, 1]
        n = len(candidates)
        return PathScores({p: s[i * n:(i + 1) * n] for i, p in enumerate(paths)},
                          {p: h[i * n:(i + 1) * n] for i, p in enumerate(paths)})

    def _fill_from_chunks(self, inp: PrefillInputs, blocks, reused) -> None:
        """Writes the isolated chunk pass's KV into the reused slots (graph kept)."""
        ctx = list(self.pw.instruction_ids) + list(self.pw.context_ids("item"))
        need = {c: e - s for (s, e), c in reused}   # chunk index → tokens taken from the pass
        ids, where, ranges = list(ctx), {}, []
        for c in sorted(need):
            where[c] = len(ids)
            ids += blocks[c][0][: need[c]]
            ranges.append((where[c], len(ids)))
        chunk = self._inputs(ids, ranges)
        prefill(self.model, chunk, self._naive, grad=True)
        for layer in range(self.model.arch.num_layers):
            for (s, e), c in reused:
                cs = where[c]
                inp.k_buf[layer][:, s:e] = chunk.k_buf[layer][:, cs:cs + e - s]
                inp.v_buf[layer][:, s:e] = chunk.v_buf[layer][:, cs:cs + e - s]
        for (s, e), _ in reused:
            inp.have_kv[s:e] = True

    def _inputs(self, ids: list[int], blocks) -> PrefillInputs:
        """Prefill inputs with every slot fresh and per-layer KV buffers (autograd-safe)."""
        m = self.model
        a, dev, n = m.arch, m.device, len(ids)

        def bufs():
            return [torch.zeros(a.num_kv_heads, n, a.head_dim, dtype=m.dtype, device=dev)
                    for _ in range(a.num_layers)]

        none = torch.zeros(n, dtype=torch.bool, device=dev)
        return PrefillInputs(torch.tensor(ids, device=dev), bufs(), bufs(), none.clone(),
                             none.clone(), torch.zeros(n, dtype=torch.int8, device=dev),
                             torch.zeros(n, dtype=torch.long, device=dev),
                             layout=Layout(n, blocks, dev))
