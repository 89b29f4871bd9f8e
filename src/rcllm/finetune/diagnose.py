"""Where the item must meet the user: the diagnostics of `rcllm diagnose` (docs/finetune.md).

Every path scores the engine's pointwise prompt (user side, then one block per candidate:
item chunk + "? Answer:"), differing only in where each item chunk's KV comes from:

- full: every token computed in the prompt.
- fast: the chunk's KV from its isolated pass (instruction + block head + itself: what the chunk
  store holds), its last `tail` tokens computed in the prompt (the adapter's fast path).
- late@s: the chunk's KV from the isolated pass in the layers below s; from layer s up every
  item token is computed in the prompt, against the user side and its own block, starting from
  its isolated pass's state entering layer s (`prefill(join=...)`). late@0 is full; late@L is
  fast with no tail.
- foreign: the chunk's KV (but its tail) built in the full prompt of another user, so the item
  states saw *a* user, not this one; the tail and the answer tokens read the real user.
- overlap@r: fast, plus the share r of the reused item tokens that rcllm's `overlap` selection
  picks computed in the prompt (`paths.overlap_policy`): the engine's rcllm method with
  `rcllm_select=overlap` at r, the user side exact.
- short: the full path with each item chunk cut to its name (`prompt.builder.item_tag`, at
  most `SHORT_TOKENS` tokens): a short candidate computed at full depth.
- full_user_swapped / fast_user_swapped: the request scored with another user's history.

Each case is also put in one of three parts by what its target shares with the user's history:
`same_item` (another ASIN whose title is the target's), `same_brand` (the lead of a
"Brand — text" title, Magazine's publisher, is an earlier item's), `neither`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..eval import metrics as M
from ..prefill.selective import Frozen, prefill
from ..prompt.builder import KINDS, RankRequest, item_brand, item_tag
from ..prefill.scoring import yes_no_score
from .paths import PathScorer, marks, overlap_policy

SHORT_TOKENS = 6
PARTS = ("same_item", "same_brand", "neither")


@dataclass
class Given:
    """KV of the first n tokens of a block's item chunk taken from another pass: per layer
    [H_kv, n, D] (keys pre-RoPE); with `join`, the tokens are computed from that layer up,
    starting from `h` [n, d], their states entering it in that pass."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    join: int | None = None
    h: torch.Tensor | None = None


def _norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def case_part(case, catalog) -> str:
    """`same_item`, `same_brand` or `neither`: what the target shares with the history."""
    tgt = catalog[case.target]
    seen = [catalog[e.item_id] for e in case.history if e.item_id in catalog]
    if any(h.item_id != tgt.item_id and _norm(item_tag(h)) == _norm(item_tag(tgt))
           for h in seen):
        return "same_item"
    brand = _norm(item_brand(tgt)) if " — " in tgt.title else ""
    if brand and any(" — " in h.title and _norm(item_brand(h)) == brand for h in seen):
        return "same_brand"
    return "neither"


class Diagnoser(PathScorer):
    """Scores one case on every diagnostic path (module docstring); no gradients."""

    def __init__(self, model, pw, tail: int, depths: Sequence[int] = (),
                 ratios: Sequence[float] = (), fill: str = "order"):
        super().__init__(model, pw, tail)
        self.depths, self.ratios, self.fill = tuple(depths), tuple(ratios), fill

    def paths(self) -> list[str]:
        return (["full", "fast"] + [f"late@{s}" for s in self.depths]
                + [f"overlap@{r:g}" for r in self.ratios]
                + ["foreign", "short", "full_user_swapped", "fast_user_swapped"])

    @torch.inference_mode()
    def score_case(self, case, other, only: Sequence[str] | None = None
                   ) -> dict[str, np.ndarray]:
        """Scores per path; `only`: just these of full, fast and late@s (no other user)."""
        if only is not None:
            return self._score_some(case, set(only))
        cands = tuple(case.candidates)
        chunks = [list(self.pw.builder.item_chunk(c)) for c in cands]
        tail = list(self.pw.prompt(RankRequest(case.user_id, case.history, cands[:1]))
                    .blocks[0][1].token_ids)
        shared = self._shared(case.user_id, case.history, cands)
        other_shared = self._shared(other.user_id, other.history, cands)
        L = self.model.arch.num_layers
        iso = self._isolated(chunks, [s for s in self.depths if 0 < s < L])
        out = {"full": self._run(shared, chunks, tail, [None] * len(chunks))}
        fast = [self._given(iso, c, len(ch) - min(self.tail, len(ch)))
                for c, ch in enumerate(chunks)]
        out["fast"] = self._run(shared, chunks, tail, fast)
        for s in self.depths:
            if s <= 0:
                out[f"late@{s}"] = out["full"]
                continue
            given = [self._given(iso, c, len(ch), join=s if s < L else None)
                     for c, ch in enumerate(chunks)]
            out[f"late@{s}"] = self._run(shared, chunks, tail, given)
        out.update(self._overlaps(case, chunks, tail, shared, fast, set(self.paths())))
        foreign_kv: list = []
        out["full_user_swapped"] = self._run(other_shared, chunks, tail, [None] * len(chunks),
                                             keep=foreign_kv)
        foreign = [Given([k[:, :len(ch) - min(self.tail, len(ch))] for k in fk],
                         [v[:, :len(ch) - min(self.tail, len(ch))] for v in fv])
                   for ch, (fk, fv) in zip(chunks, foreign_kv)]
        out["foreign"] = self._run(shared, chunks, tail, foreign)
        out["fast_user_swapped"] = self._run(other_shared, chunks, tail, fast)
        short = [list(self.pw.builder._encode(" " + item_tag(self.pw.builder.catalog[c]))
                      [:SHORT_TOKENS]) for c in cands]
        out["short"] = self._run(shared, short, tail, [None] * len(short))
        return out

    def _score_some(self, case, only: set) -> dict[str, np.ndarray]:
        cands = tuple(case.candidates)
        chunks = [list(self.pw.builder.item_chunk(c)) for c in cands]
        tail = list(self.pw.prompt(RankRequest(case.user_id, case.history, cands[:1]))
                    .blocks[0][1].token_ids)
        shared = self._shared(case.user_id, case.history, cands)
        L = self.model.arch.num_layers
        iso = self._isolated(chunks, [s for s in self.depths if 0 < s < L])
        out = {}
        if "full" in only:
            out["full"] = self._run(shared, chunks, tail, [None] * len(chunks))
        fast = [self._given(iso, c, len(ch) - min(self.tail, len(ch)))
                for c, ch in enumerate(chunks)]
        if "fast" in only:
            out["fast"] = self._run(shared, chunks, tail, fast)
        out.update(self._overlaps(case, chunks, tail, shared, fast, only))
        for s in self.depths:
            if f"late@{s}" in only:
                out[f"late@{s}"] = self._run(shared, chunks, tail, [
                    self._given(iso, c, len(ch), join=s if 0 < s < L else None)
                    if s > 0 else None for c, ch in enumerate(chunks)])
        return out

    def _overlaps(self, case, chunks, tail, shared, fast, only) -> dict[str, np.ndarray]:
        """overlap@r for each of `self.ratios` named in `only`: the fast path's given KV, and
        the tokens the selection picks computed."""
        wanted = [r for r in self.ratios if f"overlap@{r:g}" in only]
        if not wanted:
            return {}
        prompt = self.pw.prompt(RankRequest(case.user_id, case.history,
                                            tuple(case.candidates[:1])))
        return {f"overlap@{r:g}": self._run(shared, chunks, tail, fast,
                                            policy=overlap_policy(r, self.fill),
                                            slot_marks=block_marks(prompt, chunks, tail))
                for r in wanted}

    def _shared(self, user_id, history, cands) -> list[int]:
        return list(self.pw.prompt(RankRequest(user_id, history, cands[:1])).token_ids)

    def _isolated(self, chunks, depths):
        """The chunk pass (instruction + block head + each chunk): its KV per layer and, per
        depth s, the chunk tokens' states entering layer s."""
        ctx = list(self.pw.instruction_ids) + list(self.pw.context_ids("item"))
        ids, ranges = list(ctx), []
        for ch in chunks:
            ranges.append((len(ids), len(ids) + len(ch)))
            ids += ch
        states = {}
        inp = None
        for s in depths or [None]:
            inp = self._inputs(ids, ranges)
            res = prefill(self.model, inp, self._naive, capture=s)
            if s is not None:
                states[s] = (res.frozen.idx, res.frozen.h)
        return inp, ranges, states

    def _given(self, iso, c: int, n: int, join: int | None = None) -> Given | None:
        if n <= 0:
            return None
        inp, ranges, states = iso
        a = ranges[c][0]
        h = None
        if join is not None:
            idx, hs = states[join]
            pos = torch.searchsorted(idx, torch.arange(a, a + n, device=idx.device))
            h = hs[pos]
        return Given([k[:, a:a + n] for k in inp.k_buf], [v[:, a:a + n] for v in inp.v_buf],
                     join, h)

    def _run(self, shared, chunks, tail, given, keep: list | None = None, policy=None,
             slot_marks=None, user: list | None = None) -> np.ndarray:
        """Scores of the blocks (chunk + tail) after `shared`, each chunk's first tokens'
        KV as `given` says; `keep` receives each chunk's final KV per layer. `policy`: the
        selection of given tokens computed anyway (it reads `slot_marks`, kind and offset).
        `user`: the user side's KV, ([K per layer], [V per layer]), given as exact (never
        recomputed) when it holds them, else filled with the KV this pass computes."""
        ids, ranges = list(shared), []
        for ch in chunks:
            ranges.append((len(ids), len(ids) + len(ch) + len(tail)))
            ids += ch + tail
        inp = self._inputs(ids, ranges, slot_marks)
        u = len(shared)
        if user:
            for layer, (k, v) in enumerate(zip(*user)):
                inp.k_buf[layer][:, :u], inp.v_buf[layer][:, :u] = k, v
            inp.have_kv[:u] = inp.exact_kv[:u] = True
        joins: dict[int, list] = {}
        for (a, _), g in zip(ranges, given):
            if g is None:
                continue
            n = g.k[0].shape[1]
            for layer in range(len(inp.k_buf)):
                inp.k_buf[layer][:, a:a + n] = g.k[layer]
                inp.v_buf[layer][:, a:a + n] = g.v[layer]
            inp.have_kv[a:a + n] = True
            if g.join is not None:
                joins.setdefault(g.join, []).append((torch.arange(a, a + n), g.h))
        frozen = [Frozen(s, torch.cat([i for i, _ in js]).to(self.model.device),
                         torch.cat([h for _, h in js])) for s, js in sorted(joins.items())]
        res = prefill(self.model, inp, policy or self._naive, join=frozen)
        if user is not None and not user:
            user += [[k[:, :u].clone() for k in inp.k_buf],
                     [v[:, :u].clone() for v in inp.v_buf]]
        if keep is not None:
            for (a, _), ch in zip(ranges, chunks):
                keep.append(([k[:, a:a + len(ch)].clone() for k in inp.k_buf],
                             [v[:, a:a + len(ch)].clone() for v in inp.v_buf]))
        score, _ = yes_no_score(self.model, self.model.final_hidden(res.hidden_out),
                                self.pw.yes_id, self.pw.no_id)
        return score.float().cpu().numpy()


def block_marks(prompt, chunks, tail) -> tuple[list[int], list[int]]:
    """Each slot's kind and offset (`paths.marks`) in a pass of `prompt`'s user side followed by
    one block per chunk (chunk + `tail`), as the overlap selection reads them."""
    kind, offset = marks(prompt.segments)
    tail_kind = KINDS.index(prompt.blocks[0][1].kind)
    for ch in chunks:
        kind += [KINDS.index("item")] * len(ch) + [tail_kind] * len(tail)
        offset += list(range(len(ch))) + [0] * len(tail)
    return kind, offset


def diagnose(scorer: Diagnoser, cases, catalog, progress: bool = False) -> dict:
    """Per path: NDCG@10 per case; per case: its part (`case_part`)."""
    from tqdm import tqdm

    from ..eval.runner import swap_partner

    ndcg: dict[str, list[float]] = {p: [] for p in scorer.paths()}
    top: dict[str, list[tuple[float, float]]] = {p: [] for p in scorer.paths()}
    parts = []
    for i, case in enumerate(tqdm(cases, desc="diagnose", unit="req", disable=not progress)):
        got = scorer.score_case(case, cases[swap_partner(cases, i)])
        t = list(case.candidates).index(case.target)
        for p, s in got.items():
            ndcg[p].append(M.ndcg(s, t, 10))
            top[p].append((float(M.top1_agreement(got["full"], s)),
                           M.topk_overlap(got["full"], s, 5)))
        parts.append(case_part(case, catalog))
    return {"ndcg": ndcg, "agreement": top, "parts": parts}


def table(found: dict) -> list[dict]:
    """One row per path: NDCG@10 [95% CI], Δ vs full [paired CI], top-1/top-5 agreement
    with full, and NDCG@10 on each part of the requests."""
    nd, parts = found["ndcg"], np.array(found["parts"])
    full = np.array(nd["full"])
    rows = []
    for p, vals in nd.items():
        v = np.array(vals)
        ci, d = M.bootstrap_ci(v), M.paired_bootstrap_ci(v, full)
        agree = np.array(found["agreement"][p])
        row = {"path": p, "requests": len(v), "ndcg@10": float(v.mean()),
               "ci_low": ci.low, "ci_high": ci.high, "delta_vs_full": d.mean,
               "delta_ci_low": d.low, "delta_ci_high": d.high,
               "top1_agreement": float(agree[:, 0].mean()),
               "top5_overlap": float(agree[:, 1].mean())}
        if p.endswith("_user_swapped"):
            own = np.array(nd[p[:-len("_user_swapped")]])
            drop = M.paired_bootstrap_ci(own, v)
            row.update(user_swap_drop=drop.mean, drop_ci_low=drop.low, drop_ci_high=drop.high)
        for part in PARTS:
            sel = parts == part
            row[f"ndcg@10_{part}"] = float(v[sel].mean()) if sel.any() else None
            row[f"n_{part}"] = int(sel.sum())
        rows.append(row)
    return rows
