"""Candidate scores of one ranking prompt on the full path, the reuse path, or both at once.

- full: the engine's pointwise prompt (user side, then one block per candidate, "Will I like
  <item chunk>? Answer:") computed whole; what `rcllm eval --methods full` ranks by.
- reuse: each item chunk's KV comes from a pass where the chunk sees only its template context
  (instruction + block head) and itself — what the chunk store holds — except its last `tail`
  tokens, which are computed in the prompt, seeing the user side (`reuse.item_tail`); the rest of
  the prompt is computed over that KV: what the engine's naive reuse with that item tail and the
  user side exact serves. With a selection (`select`, e.g. `overlap_policy(0.15)`: rcllm's
  `rcllm_select=overlap`) the tokens it picks among the reused ones are computed in the prompt
  too, as the engine's rcllm method with that selection and the user side exact does.

Both go through the engine's own selective prefill (`prefill(..., grad=True)`) and read the
score with `prefill.scoring.yes_no_score`. When both paths are asked for, one pass holds the
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
from ..prefill.scoring import yes_no_score
from ..prefill.selection import SelectionPolicy, selection_policy
from ..prefill.layout import Layout
from ..prefill.selective import Frozen, PrefillInputs, prefill
from ..prompt.builder import KINDS, RankRequest
from ..records import HistoryEntry, ItemId, UserId
from .itemstates import Budget, ItemStates

PATHS = ("full", "reuse")


def overlap_policy(ratio: float, fill: str = "order") -> SelectionPolicy:
    """The engine's rcllm selection `rcllm_select=overlap` at `ratio` of the reused item (and
    history) tokens, its rest filled as `fill` says (`reuse.overlap_fill`), the other options at
    their defaults (what `rcllm eval --methods rcllm --item-ratio R --history-ratio R --set
    reuse.rcllm_select=overlap --set reuse.overlap_fill=F` serves)."""
    return selection_policy(ReuseConfig(method="rcllm", rcllm_select="overlap",
                                        item_ratio=ratio, history_ratio=ratio,
                                        overlap_fill=fill))


def marks(segments) -> tuple[list[int], list[int]]:
    """Each slot's kind (index in KINDS) and offset in its chunk (0 outside chunks), as the
    engine's prefill inputs carry them (selections read them)."""
    kind: list[int] = []
    offset: list[int] = []
    for seg in segments:
        n = len(seg.token_ids)
        kind += [KINDS.index(seg.kind)] * n
        offset += list(range(n)) if seg.is_chunk else [0] * n
    return kind, offset


@dataclass
class PathScores:
    """Per path asked for: scores [C] (yes − no log-odds) and the final-normed hidden states at
    the answer slots [C, d] (for a hidden-state match); `late_kv`: with `late_distill` on the
    late path scored beside full, the item tokens' K/V mismatch above the join (`_late_kv`)."""

    scores: dict[str, torch.Tensor]
    hidden: dict[str, torch.Tensor]
    late_kv: torch.Tensor | None = None


class FrozenCache:
    """The frozen layers' output per prompt: the prompt pass's `Frozen`, and its chunk pass's
    when item chunks' states are not kept (`train.item_cache=false`), kept while the `budget`
    it shares with those states allows (later prompts are computed whole)."""

    def __init__(self, layer: int, budget: Budget):
        self.layer, self.budget = layer, budget
        self.held: dict = {}
        self.hits = 0

    @property
    def used(self) -> int:
        return self.budget.used

    def get(self, key) -> tuple[Frozen, Frozen | None] | None:
        got = self.held.get(key)
        self.hits += got is not None
        return got

    def put(self, key, main: Frozen, chunk: Frozen | None) -> None:
        if self.budget.take(main.nbytes + (chunk.nbytes if chunk is not None else 0)):
            self.held[key] = (main, chunk)


class PathScorer:
    """Scores candidates on the paths asked for; mutates nothing but the model's autograd graph.
    `pw` is the engine's PointwisePrompt, `tail` the item tail of the reuse path.

    `frozen_layer` > 0: the weights below that layer never change (LoRA from `lora.first_layer`
    on), so the states entering it are a function of the prompt: the first scoring of a prompt
    records them (up to `cache_bytes`) and later scorings of the same prompt (the next epoch, the
    next validation) run only the layers from there on. The reuse path's isolated chunk pass
    below that layer (below the late layer on the late path) is a function of each chunk alone:
    `itemstates.ItemStates` keeps it per item chunk, within the same `cache_bytes`, from the
    first prompt that holds the chunk on (`item_cache`, `train.item_cache`). Exact: the scores
    are the same.

    Late path with trained layers below the join (`frozen_layer` < `late`, DeFormer-style):
    the chunk pass runs per prompt with the graph from the first trained layer up to the join
    and stops there; `late_distill` also returns the item tokens' K/V mismatch above it."""

    def __init__(self, model, pw, tail: int, frozen_layer: int = 0, cache_bytes: int = 0,
                 select: SelectionPolicy | None = None, late: int = 0,
                 item_cache: bool = True, late_distill: bool = False):
        if late and not 0 < late < model.arch.num_layers:
            raise ValueError(f"late layer {late} must be within 1..num_layers-1")
        if late_distill and not late:
            raise ValueError("late_distill needs the late path")
        self.model, self.pw, self.tail, self.late = model, pw, tail, late
        self.late_distill, self.frozen_layer = late_distill, frozen_layer
        self._naive = SelectionPolicy(ReuseConfig(method="naive"))  # compute what is not given
        # the prompt pass's selection: which reused tokens it computes besides the fresh ones
        self.select = select if select is not None else self._naive
        budget = Budget(cache_bytes) if frozen_layer > 0 and cache_bytes > 0 else None
        self.cache = FrozenCache(frozen_layer, budget) if budget is not None else None
        # the isolated chunk pass below the late layer, or below the first trained one
        kept = budget if item_cache else None
        if late:    # 0 when every layer trains: the chunk pass runs whole to the join
            below = min(late, frozen_layer)
        else:
            below = frozen_layer if kept is not None else 0
        self.items = (ItemStates(model, self._chunk_context(), below, self._inputs, kept)
                      if below else None)

    def score(self, user_id: UserId, history: tuple[HistoryEntry, ...],
              candidates: tuple[ItemId, ...], paths: tuple[str, ...]) -> PathScores:
        if self.cache is not None and list(candidates) != sorted(candidates):
            # blocks all start after the user side, so their order changes no score: score
            # them sorted (one cache entry per candidate set) and hand them back in order
            order = sorted(range(len(candidates)), key=lambda i: candidates[i])
            got = self.score(user_id, history, tuple(candidates[i] for i in order), paths)
            back = torch.tensor(order).argsort()   # sorted position of each candidate
            return PathScores({p: v[back] for p, v in got.scores.items()},
                              {p: v[back] for p, v in got.hidden.items()}, got.late_kv)
        prompt = self.pw.prompt(RankRequest(user_id, history, candidates))
        # (item chunk, block ending) of each block: PointwisePrompt's block layout
        blocks = [(list(item.token_ids), list(tail.token_ids)) for item, tail in prompt.blocks]
        ids, ranges, reused = list(prompt.token_ids), [], []  # reused: (slot range, chunk index)
        kind, offset = marks(prompt.segments)
        for path in paths:
            for c, (chunk, tail) in enumerate(blocks):
                s = len(ids)
                ids += chunk + tail
                k, o = marks(prompt.blocks[c])
                kind += k
                offset += o
                ranges.append((s, len(ids)))
                keep = self._reused_tokens(len(chunk))
                if path == "reuse" and keep:
                    reused.append(((s, s + keep), c))
        inp = self._inputs(ids, ranges, (kind, offset))
        key = (user_id, history, candidates, paths)
        got = self.cache.get(key) if self.cache is not None else None
        main, chunk = got if got is not None else (None, None)
        capture = self.cache.layer if self.cache is not None and got is None else None
        join: list[Frozen] = []
        if reused and self.late:
            lo = main.layer if main is not None else 0
            if lo < self.late:   # else the cached main pass starts with the slots joined
                join = [self._late_from_chunks(inp, blocks, reused, lo)]
        elif reused:
            chunk = self._fill_from_chunks(inp, blocks, reused, main, chunk, capture)
        res = prefill(self.model, inp, self.select, grad=True, start=main, capture=capture,
                      join=join)
        if capture is not None:
            self.cache.put(key, res.frozen, chunk)
        h = self.model.final_hidden(res.hidden_out)              # [P·C, d]
        s, _ = yes_no_score(self.model, h, self.pw.yes_id, self.pw.no_id)
        n = len(candidates)
        late_kv = (self._late_kv(inp, ranges[:n], reused)
                   if self.late_distill and paths == ("full", "reuse") and reused else None)
        return PathScores({p: s[i * n:(i + 1) * n] for i, p in enumerate(paths)},
                          {p: h[i * n:(i + 1) * n] for i, p in enumerate(paths)}, late_kv)

    def _late_kv(self, inp: PrefillInputs, full_ranges, reused) -> torch.Tensor:
        """The item tokens' K and V on the reuse path against the full path's (no gradient), at
        each trained layer from the join up: squared error over the full path's squared norm,
        averaged over the layers and K/V. Read from the joint pass's buffers: what the answer
        slots read of the items (their final states are never read), free of another pass."""
        full = torch.cat([torch.arange(full_ranges[c][0], full_ranges[c][0] + e - s)
                          for (s, e), c in reused]).to(inp.ids.device)   # the same tokens
        mine = torch.cat([torch.arange(s, e) for (s, e), _ in reused]).to(inp.ids.device)
        errs = []
        for layer in range(max(self.late, self.frozen_layer), self.model.arch.num_layers):
            for buf in (inp.k_buf, inp.v_buf):
                want = buf[layer][:, full].detach()
                errs.append((buf[layer][:, mine] - want).pow(2).sum() / want.pow(2).sum())
        return torch.stack(errs).mean()

    def _reused_tokens(self, n: int) -> int:
        """How many of a chunk's n tokens the reuse path takes from the isolated chunk pass:
        all on the late path (computed from the late layer up), else all but the item tail."""
        return n - (0 if self.late else min(self.tail, n))

    def warm_items(self, candidates) -> int:
        """Computes and keeps the isolated chunk pass's states of these candidates' chunks
        (what the first prompt holding each would); returns how many are held."""
        if self.items is None or self.items.budget is None:
            return 0
        chunks = {}
        for c, item in enumerate(candidates):
            toks = list(self.pw.builder.item_chunk(item))
            if self._reused_tokens(len(toks)):
                chunks[c] = toks[:self._reused_tokens(len(toks))]
        with torch.no_grad():
            self.items.get(chunks)
        return len(self.items.held)

    def _chunk_context(self) -> list[int]:
        """What each chunk sees in the isolated chunk pass: instruction + block head."""
        return list(self.pw.instruction_ids) + list(self.pw.context_ids("item"))

    @staticmethod
    def _chunks(blocks, reused) -> dict[int, list[int]]:
        """Chunk index -> the tokens the prompt takes from the isolated chunk pass."""
        need = {c: e - s for (s, e), c in reused}
        return {c: blocks[c][0][:need[c]] for c in sorted(need)}

    def _fill_from_chunks(self, inp: PrefillInputs, blocks, reused, main: Frozen | None,
                          start: Frozen | None, capture: int | None) -> Frozen | None:
        """Writes the isolated chunk pass's KV into the reused slots (graph kept): every layer,
        or from `main.layer` on when the prompt pass starts there. Below the first trained
        layer the chunks' states come from `self.items` when it keeps them; else the pass
        runs whole, or from this prompt's own `start` (its states `capture`d the first time,
        returned for the prompt cache)."""
        chunks = self._chunks(blocks, reused)
        chunk, where = self._chunk_pass_inputs(chunks)
        got: dict = {}              # chunk index -> its ChunkStates below `first`
        if self.items is None:     # the whole pass, or from this prompt's captured states
            res = prefill(self.model, chunk, self._naive, grad=True, start=start,
                          capture=capture)
            first = start.layer if start is not None else 0
            start = res.frozen if capture is not None else start
        else:
            ctx, got = self.items.get(chunks)
            first = self.items.layer
            h = torch.cat([ctx.h] + [got[c].h for c in chunks])   # the pass's slot order
            prefill(self.model, chunk, self._naive, grad=True,
                    start=Frozen(first, torch.arange(len(h), device=h.device), h))
        lo = main.layer if main is not None else 0   # the prompt pass reads the KV from here
        for (s, e), c in reused:
            cs = where[c]
            for layer in range(lo, self.model.arch.num_layers):
                below = layer < first       # from the item states, else from the pass
                inp.k_buf[layer][:, s:e] = (got[c].k[layer] if below
                                            else chunk.k_buf[layer][:, cs:cs + e - s])
                inp.v_buf[layer][:, s:e] = (got[c].v[layer] if below
                                            else chunk.v_buf[layer][:, cs:cs + e - s])
            inp.have_kv[s:e] = True
        return start

    def _chunk_pass_inputs(self, chunks: dict[int, list[int]]
                           ) -> tuple[PrefillInputs, dict[int, int]]:
        """The isolated chunk pass's inputs (instruction + block head, then each reused chunk's
        first tokens) and where each chunk starts in it."""
        ids, where, ranges = self._chunk_context(), {}, []
        for c, toks in chunks.items():
            where[c] = len(ids)
            ids += toks
            ranges.append((where[c], len(ids)))
        return self._inputs(ids, ranges), where

    def _late_from_chunks(self, inp: PrefillInputs, blocks, reused, lo: int) -> Frozen:
        """late@s: the isolated chunk pass's KV in the reused slots below layer s (from layer
        `lo` on, where the prompt pass starts), and the slots' states entering s, from which
        the prompt pass computes them (`prefill(join=...)`). Below the first trained layer
        they come per item chunk from `self.items`; from there up to s (trained layers below
        the join) the chunk pass runs in this prompt with the graph and stops at s."""
        chunks = self._chunks(blocks, reused)
        ctx, got = self.items.get(chunks) if self.items is not None else (None, {})
        first = self.items.layer if self.items is not None else 0
        if first < self.late:
            chunk, where = self._chunk_pass_inputs(chunks)
            start = None
            if first:
                h = torch.cat([ctx.h] + [got[c].h for c in chunks])   # the pass's slot order
                start = Frozen(first, torch.arange(len(h), device=h.device), h)
            at = prefill(self.model, chunk, self._naive, grad=True, start=start,
                         stop=self.late).frozen                     # row i is slot i
        slots, hs = [], []
        for (s, e), c in reused:
            for layer in range(lo, self.late):
                own = layer < first
                inp.k_buf[layer][:, s:e] = (got[c].k[layer] if own else
                                            chunk.k_buf[layer][:, where[c]:where[c] + e - s])
                inp.v_buf[layer][:, s:e] = (got[c].v[layer] if own else
                                            chunk.v_buf[layer][:, where[c]:where[c] + e - s])
            inp.have_kv[s:e] = True
            slots += range(s, e)
            hs.append(got[c].h if first == self.late else at.h[where[c]:where[c] + e - s])
        return Frozen(self.late, torch.tensor(slots, device=self.model.device), torch.cat(hs))

    def _inputs(self, ids: list[int], blocks, slot_marks=None) -> PrefillInputs:
        """Prefill inputs with every slot fresh and per-layer KV buffers (autograd-safe);
        `slot_marks`: (kind, offset) per slot (`marks`), zeros when not given."""
        m = self.model
        a, dev, n = m.arch, m.device, len(ids)

        def bufs():
            return [torch.zeros(a.num_kv_heads, n, a.head_dim, dtype=m.dtype, device=dev)
                    for _ in range(a.num_layers)]

        kind, offset = slot_marks if slot_marks is not None else ([0] * n, [0] * n)
        none = torch.zeros(n, dtype=torch.bool, device=dev)
        return PrefillInputs(torch.tensor(ids, device=dev), bufs(), bufs(), none.clone(),
                             none.clone(), torch.tensor(kind, dtype=torch.int8, device=dev),
                             torch.tensor(offset, dtype=torch.long, device=dev),
                             layout=Layout(n, blocks, dev))
