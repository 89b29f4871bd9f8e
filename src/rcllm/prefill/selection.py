"""Which reused tokens each method recomputes.

Budgets are fractions of the *reused* tokens of a kind (history, item): `ratio × count`
tokens are recomputed, rounded to the nearest token. Fresh tokens (instruction misses,
dynamic bits, the question, chunk misses) are always computed and are not part of a budget.

- full / prefix / naive: nothing reused is recomputed (full and prefix simply have no reused
  tokens; naive reuses every cached chunk as is).
- epic: the first `epic_k` tokens of every chunk (static, no probe).
- cacheblend: one ratio (`item_ratio`) over all reused tokens pooled, by layer-1 deviation.
- rcllm: per kind its own ratio (spread over the whole prompt, or with `budget_scope`
  "block" over each candidate block alike); inside the budget first the first `window`
  tokens of each chunk (a reused chunk's first tokens were built as attention sinks), then
  the rest by a score combining layer-1 deviation and layer-0 attention mass (each
  normalised by its mean over the tokens it ranks). When the budget fits inside the windows
  only window tokens are ranked, so only they need the probe (`probe_set`). With
  `depth_decay` the budget shrinks with depth (`layer_set`): between layers the recomputed
  tokens the probe scored lowest stop being recomputed (a token's score decides how deep it
  is recomputed), and their reused KV stands in the layers above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ReuseConfig
from ..prompt.builder import KINDS

HISTORY, ITEM = KINDS.index("history"), KINDS.index("item")


@dataclass
class Probe:
    deviation: torch.Tensor  # [N] layer-1 KV deviation of probed reused tokens (0 elsewhere)
    mass: torch.Tensor | None   # [N] layer-0 attention mass received from the last queries
    mass1: torch.Tensor | None  # [N] the same at layer 1 (over the probe's layer-1 keys)
    probed: torch.Tensor | None = None  # [N] bool: deviation known (None: every reused token)


def _top(mask: torch.Tensor, score: torch.Tensor, k: int) -> torch.Tensor:
    """Bool [N]: the k highest-scoring positions among `mask` (ties → earlier position)."""
    out = torch.zeros_like(mask)
    cand = torch.nonzero(mask).squeeze(1)
    if k <= 0 or len(cand) == 0:
        return out
    k = min(k, len(cand))
    order = torch.argsort(score[cand], descending=True, stable=True)[:k]
    out[cand[order]] = True
    return out


def _budget(ratio: float, count: int) -> int:
    return int(round(ratio * count))


class SelectionPolicy:
    needs_probe = False

    def mass_layers(self) -> tuple[int, ...]:
        """Layers whose attention mass select() reads (the probe computes only those)."""
        return ()

    def __init__(self, cfg: ReuseConfig):
        self.cfg = cfg

    def static_set(self, inp) -> torch.Tensor:
        """Tokens computed at every layer without a probe (beyond the fresh ones)."""
        return torch.zeros_like(inp.have_kv)

    def probe_set(self, inp) -> torch.Tensor | None:
        """Reused tokens whose probe score select() may read (layer 0 runs on them and the
        fresh ones); None = every reused token."""
        return None

    def select(self, inp, probe: Probe) -> torch.Tensor:
        """Tokens recomputed at layer 1 after the probe (fresh ones are added by the caller)."""
        return self.static_set(inp)

    def layer_set(self, inp, depth: float, idx: torch.Tensor, probe: Probe
                  ) -> torch.Tensor | None:
        """Which of the slots idx [n] computed at the previous layer the layer at `depth`
        (0 = layer 1, 1 = the last) computes, as bool [n]. The set only shrinks (a dropped
        token's hidden state is gone) and keeps every fresh slot. None = all of them."""
        return None


class EpicPolicy(SelectionPolicy):
    def static_set(self, inp) -> torch.Tensor:
        return inp.have_kv & ~inp.exact_kv & (inp.offset < self.cfg.epic_k)


class CacheBlendPolicy(SelectionPolicy):
    needs_probe = True

    def select(self, inp, probe: Probe) -> torch.Tensor:
        reused = inp.have_kv & ~inp.exact_kv
        return _top(reused, probe.deviation, _budget(self.cfg.item_ratio, int(reused.sum())))


def _normalised(x: torch.Tensor, over: torch.Tensor) -> torch.Tensor:
    return x / x[over].mean().clamp_min(1e-12)


class RcllmPolicy(SelectionPolicy):
    needs_probe = True

    def mass_layers(self) -> tuple[int, ...]:
        return (self.cfg.attention_layer,)

    def _groups(self, inp):
        """Per kind with a budget: (kind, group [N] bool, ratio, its units). A unit is what
        one budget is spread over: the whole group, or with `budget_scope` "block" each
        candidate block's part of it (and the shared part's) — so every candidate's score is
        recomputed to the same degree. Each unit is (unit [N] bool, its layer-1 budget,
        window [N] bool)."""
        reused = inp.have_kv & ~inp.exact_kv
        for kind, ratio in ((HISTORY, self.cfg.history_ratio), (ITEM, self.cfg.item_ratio)):
            group = reused & (inp.kind == kind)
            if not bool(group.any()):
                continue
            if self.cfg.budget_scope == "block" and inp.layout.blocks:
                block = inp.layout.block
                parts = [group & (block == b) for b in torch.unique(block[group]).tolist()]
            else:
                parts = [group]
            units = [(u, _budget(ratio, int(u.sum())), u & (inp.offset < self.cfg.window))
                     for u in parts]
            if any(budget for _, budget, _ in units):
                yield kind, group, ratio, units

    def probe_set(self, inp) -> torch.Tensor:
        out = torch.zeros_like(inp.have_kv)
        for _, _, _, units in self._groups(inp):
            for unit, budget, window in units:
                if budget:
                    out |= window if budget <= int(window.sum()) else unit
        return out

    def _score(self, inp, probe: Probe, group: torch.Tensor) -> torch.Tensor:
        """[N] deviation + attention_weight × mass, each normalised by its mean over the
        probed tokens of `group` (the tokens it ranks); `rcllm_select=attention`: the mass
        alone."""
        probed = probe.probed if probe.probed is not None else inp.have_kv & ~inp.exact_kv
        ranked = group & probed
        raw = probe.mass1 if self.cfg.attention_layer == 1 else probe.mass
        if self.cfg.rcllm_select == "attention":
            return _normalised(raw, ranked)
        return (_normalised(probe.deviation, ranked)
                + self.cfg.attention_weight * _normalised(raw, ranked))

    def select(self, inp, probe: Probe) -> torch.Tensor:
        chosen = torch.zeros_like(inp.have_kv)
        for _, group, _, units in self._groups(inp):
            score = self._score(inp, probe, group)
            for unit, budget, window in units:
                n_window = int(window.sum())
                if budget <= n_window:
                    chosen |= _top(window, score, budget)
                else:
                    chosen |= window | _top(unit & ~window, score, budget - n_window)
        return chosen

    def layer_ratio(self, ratio: float, depth: float) -> float:
        """The budget at `depth` (0 = layer 1, 1 = the last): ratio^(1 + depth_decay × depth).
        1.0 stays 1.0 (exact mode) and 0 stays 0."""
        return ratio ** (1.0 + self.cfg.depth_decay * depth)

    def layer_set(self, inp, depth, idx, probe):
        if self.cfg.depth_decay == 0:
            return None
        keep = torch.ones(len(idx), dtype=torch.bool, device=idx.device)
        reused = (inp.have_kv & ~inp.exact_kv)[idx]
        for _, group, ratio, units in self._groups(inp):
            score = None  # computed when a unit first has to drop tokens at this depth
            for unit, _, _ in units:
                now = reused & unit[idx]
                budget = _budget(self.layer_ratio(ratio, depth), int(unit.sum()))
                if budget < int(now.sum()):  # the probe's order: the best-scored stay longest
                    if score is None:
                        score = self._score(inp, probe, group)[idx]
                    keep &= ~now | _top(now, score, budget)
        return keep


RUN = 3  # `overlap`: the shortest run of tokens shared with the history that counts


def shared_runs(ids: list[int], chunk: list[tuple[int, int]], history: list[tuple[int, int]],
                run: int = RUN) -> set[int]:
    """Slots of the chunks [(start, end)] inside a run of >= `run` tokens that also occurs in
    one of the history chunks [(start, end)] (token ids `ids`)."""
    grams = {tuple(ids[i:i + run]) for s, e in history for i in range(s, e - run + 1)}
    out: set[int] = set()
    for s, e in chunk:
        for i in range(s, e - run + 1):
            if tuple(ids[i:i + run]) in grams:
                out.update(range(i, i + run))
    return out


def _spans(mask: torch.Tensor, offset: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each chunk among the slots of `mask` (a chunk starts at offset 0)."""
    slots = torch.nonzero(mask).squeeze(1).tolist()
    spans: list[list[int]] = []
    off = offset.tolist()
    for p in slots:
        if spans and off[p] != 0 and spans[-1][1] == p:
            spans[-1][1] = p + 1
        else:
            spans.append([p, p + 1])
    return [(s, e) for s, e in spans]


class OverlapPolicy(RcllmPolicy):
    """rcllm with `rcllm_select=overlap`: no probe. Per kind and unit its budget goes first to
    the reused item tokens inside a run shared with the user's history chunks (`shared_runs`;
    earliest first), then (`overlap_fill=order`) to each chunk's first tokens (the window),
    then in order — or (`overlap_fill=ends`) to every chunk's last tokens alike, the last of
    each chunk first, then the one before it, ...: no candidate is recomputed more than another
    for its place in the prompt."""

    needs_probe = False

    def static_set(self, inp) -> torch.Tensor:
        ids = inp.ids.tolist()
        history = _spans(inp.kind == HISTORY, inp.offset)
        items = _spans(inp.kind == ITEM, inp.offset)
        shared = torch.zeros_like(inp.have_kv)
        hit = sorted(shared_runs(ids, items, history))
        if hit:
            shared[torch.tensor(hit, device=shared.device)] = True
        n = len(ids)
        # earlier slots rank higher within a tier: shared runs, then windows, then the rest
        order = torch.arange(n, 0, -1, device=shared.device, dtype=torch.float32) / (n + 1)
        if self.cfg.overlap_fill == "ends":  # then every chunk's last tokens, round-robin
            to_end = torch.zeros(n, dtype=torch.float32, device=shared.device)
            for s, e in items:
                to_end[s:e] = torch.arange(e - s - 1, -1, -1, dtype=torch.float32)
            score = 4.0 * shared.float() + 2.0 - to_end / (to_end.max() + 1) + order / (n + 1)
        else:
            score = order + 2.0 * (inp.offset < self.cfg.window).float() + 4.0 * shared.float()
        chosen = torch.zeros_like(inp.have_kv)
        for _, _, _, units in self._groups(inp):
            for unit, budget, _ in units:
                chosen |= _top(unit, score, budget)
        return chosen

    def layer_set(self, inp, depth, idx, probe):
        return None


def selection_policy(cfg: ReuseConfig) -> SelectionPolicy:
    if cfg.method == "rcllm" and cfg.rcllm_select == "overlap":
        return OverlapPolicy(cfg)
    return {"epic": EpicPolicy, "cacheblend": CacheBlendPolicy,
            "rcllm": RcllmPolicy}.get(cfg.method, SelectionPolicy)(cfg)
