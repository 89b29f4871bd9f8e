"""Which reused tokens each method recomputes.

Budgets are fractions of the *reused* tokens of a kind (history, item): `ratio × count`
tokens are recomputed, rounded to the nearest token. Fresh tokens (instruction misses,
dynamic bits, the question, chunk misses) are always computed and are not part of a budget.

- full / prefix / naive: nothing reused is recomputed (full and prefix simply have no reused
  tokens; naive reuses every cached chunk as is).
- epic: the first `epic_k` tokens of every chunk (static, no probe).
- cacheblend: one ratio (`item_ratio`) over all reused tokens pooled, by layer-1 deviation.
- rcllm: per kind its own ratio; inside the budget first the first `window` tokens of each
  chunk (a reused chunk's first tokens were built as attention sinks), then the rest by a
  score combining layer-1 deviation and layer-0 attention mass (each normalised by its mean
  over the kind's reused tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ReuseConfig
from ..prompt.builder import KINDS

HISTORY, ITEM = KINDS.index("history"), KINDS.index("item")


@dataclass
class Probe:
    deviation: torch.Tensor  # [N] layer-1 KV deviation of reused tokens (0 elsewhere)
    mass: torch.Tensor | None   # [N] layer-0 attention mass received from the last queries
    mass1: torch.Tensor | None  # [N] the same at layer 1 (over the probe's layer-1 keys)


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

    def select(self, inp, probe: Probe) -> torch.Tensor:
        """Tokens recomputed at layers >= 1 after the probe (fresh ones are added by the caller)."""
        return self.static_set(inp)


class EpicPolicy(SelectionPolicy):
    def static_set(self, inp) -> torch.Tensor:
        return inp.have_kv & ~inp.exact_kv & (inp.offset < self.cfg.epic_k)


class CacheBlendPolicy(SelectionPolicy):
    needs_probe = True

    def select(self, inp, probe: Probe) -> torch.Tensor:
        reused = inp.have_kv & ~inp.exact_kv
        return _top(reused, probe.deviation, _budget(self.cfg.item_ratio, int(reused.sum())))


class RcllmPolicy(SelectionPolicy):
    needs_probe = True

    def mass_layers(self) -> tuple[int, ...]:
        return (self.cfg.attention_layer,)

    def select(self, inp, probe: Probe) -> torch.Tensor:
        reused = inp.have_kv & ~inp.exact_kv
        chosen = torch.zeros_like(reused)
        for kind, ratio in ((HISTORY, self.cfg.history_ratio), (ITEM, self.cfg.item_ratio)):
            group = reused & (inp.kind == kind)
            count = int(group.sum())
            budget = _budget(ratio, count)
            if budget == 0:
                continue
            dev = probe.deviation / probe.deviation[group].mean().clamp_min(1e-12)
            raw = probe.mass1 if self.cfg.attention_layer == 1 else probe.mass
            mass = raw / raw[group].mean().clamp_min(1e-12)
            score = dev + self.cfg.attention_weight * mass
            window = group & (inp.offset < self.cfg.window)
            n_window = int(window.sum())
            if budget <= n_window:
                chosen |= _top(window, score, budget)
            else:
                chosen |= window | _top(group & ~window, score, budget - n_window)
        return chosen


def selection_policy(cfg: ReuseConfig) -> SelectionPolicy:
    return {"epic": EpicPolicy, "cacheblend": CacheBlendPolicy,
            "rcllm": RcllmPolicy}.get(cfg.method, SelectionPolicy)(cfg)
