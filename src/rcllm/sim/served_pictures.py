"""The router's pictures beyond item KV in the cache replay (`served_cache`, `rcllm sim sweep
--routing caches`): the prompt prefixes each instance's prefix cache holds (prefix-aware) and
where each user's user side is (user-side, and every policy of a pointwise deployment, which
counts the side as one more item). Plain Python: no model, no torch, no serve import.

- prefixes: one `routing.prefixes.PrefixIndex` per simulated cluster, the object the served
  router keeps (`serve/router._prefixes`), sized by the same rule: the engine's prefix cache
  capacity (`PrefixCache`'s default, which the engine keeps) over the model's KV bytes per
  token (`serve/host.prefix_cache_info`); none where the engines insert no prompts
  (`reuse.prefix_insert` off). A request of a method that inserts its exact prompt (full,
  prefix) puts its chain on its instance when answered (`serve/picture.prompt_served`). The
  same index stands for the engines' caches: a request's prefix hit is its longest held chain.
- user sides: per cell (the sweep starts each cell with a fresh `serve/views.UserResidency`)
  the instance that last prewarmed or ranked each user, with the window it was built from and
  its expiry (the user-prefix cache's TTL); a side serves a request whose window equals it (a
  hit) or extends it (an append). A relay's prewarm (`--relay-lead-s`: the cell's
  `prewarm_requests`, one per ranking, aligned with its rows) is routed by the cell's policy
  over the user side alone at its send time, as `serve/router.prewarm` does; one the sweep saw
  fail is left out. Its engine time is not simulated (as in `served.py`).

A history entry is its item id dated by the cell (`entry_key` of {item_id, timestamp}): the
rows keep ids only, and the sweep redates its trace per cell, so no chain or side of one cell
matches another's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import PREFIX_INSERTING, USER_SIDE_METHODS, RcllmConfig, load
from ..errors import RcllmError
from ..routing import ClusterView, SetLocality
from ..routing.prefixes import PrefixIndex, PrefixView
from ..routing.registry import REGISTRY
from ..routing.requests import entry_key, routing_request, user_key
from ..routing.views import RoutingRequest

# the engine's prefix cache capacity: `prefill.prefix_cache.PrefixCache`'s default, which
# `Engine` keeps (the simulator may not import the torch side; a test holds the two equal)
PREFIX_CACHE_BYTES = 1 << 30
# what a policy may read for the replay to route as it did (`registry.PolicySpec.reads`)
SIMULABLE_READS = ("order", "load", "items", "prefixes", "users")


def engine_settings(sweep: Mapping[str, Any]) -> RcllmConfig:
    """The instances' engine settings: the defaults, the sweep's `--config` file where it is
    still there, and its `--set` overrides."""
    cfg = sweep.get("config") or {}
    path = cfg.get("config")
    return load(RcllmConfig, path if path and os.path.exists(str(path)) else None,
                [str(o) for o in cfg.get("overrides") or ()])


def is_pointwise(sweep: Mapping[str, Any]) -> bool:
    """Whether the sweep's engines kept user sides (the pointwise scorer): as asked, or as a
    row or a prewarm shows."""
    if (sweep.get("config") or {}).get("scorer") == "pointwise":
        return True
    return any(r.get("user_prefix", "off") not in ("off", None) or c.get("prewarm_requests")
               for c in sweep["cells"] for r in c["requests"])


class _WithSide:
    """An instance's held items plus one user's side (for `SetLocality`'s membership test)."""

    def __init__(self, held, key) -> None:
        self.held, self.key = held, key

    def __contains__(self, x: object) -> bool:
        return x == self.key or x in self.held


@dataclass
class Exact:
    """What a request's exact part found at its instance (`engine/lookups.exact_match`): the
    prefix cache's tokens (the instruction's and its held chain's, the engine's
    `prefix_tokens`), the user side's state, and the tokens it reuses exactly."""

    prefix_tokens: float = 0.0
    user_side: str = "off"          # hit | append | miss | off
    reused: float = 0.0


class Pictures:
    """The prefix index of the simulated cluster and the current cell's user sides."""

    def __init__(self, sweep: Mapping[str, Any], kv_bytes_per_token: int, instances: int,
                 item_tokens: dict[str, int]) -> None:
        cfg = engine_settings(sweep)
        self.window = int(cfg.prompt.history_window)
        self.pointwise = is_pointwise(sweep)
        self.instruction = float(sweep.get("prefix_instruction_tokens") or 0)
        self.prefixes = (PrefixIndex(instances, PREFIX_CACHE_BYTES // max(1, kv_bytes_per_token))
                         if cfg.reuse.prefix_insert else None)
        self.ttl_ms = 1e3 * float(cfg.userprefix.ttl_s or cfg.userprefix.max_ttl_s)
        self.tokens = item_tokens
        self.homes: dict[str, tuple[int, float, tuple]] = {}
        self.tag = ""
        self.ratios: dict[str, float] = {}

    def new_cell(self, tag: str, ratios: tuple[float, float] | None = None) -> None:
        """A new cell: its history tag, and the recompute budgets its series' payloads name
        (the router prices each request at them, `routing_request`)."""
        self.tag, self.homes = tag, {}
        self.ratios = ({} if ratios is None
                       else {"item_ratio": ratios[0], "history_ratio": ratios[1]})

    def check(self, policies: Sequence[str]) -> None:
        """RcllmError for a policy whose picture this sweep's engines did not keep."""
        if "prefix-aware" in policies and self.prefixes is None:
            raise RcllmError("prefix-aware cells, but the sweep's engines inserted no prompts "
                             "(reuse.prefix_insert off): its router kept no prefix picture")
        if "user-side" in policies and not self.pointwise:
            raise RcllmError("user-side cells need user sides (the pointwise scorer); this "
                             "sweep's engines kept none")

    def payload(self, row: Mapping[str, Any], candidates: bool = True) -> dict:
        return {"user_id": str(row.get("user")),
                "candidates": list(row.get("items") or ()) if candidates else [],
                "history": [{"item_id": str(h), "timestamp": self.tag}
                            for h in row.get("history_items") or ()], **self.ratios}

    def request(self, row: Mapping[str, Any], candidates: bool = True) -> RoutingRequest:
        """The router's translation of the row's payload (a prewarm's: no candidates)."""
        return routing_request(self.payload(row, candidates), self.tokens, self.pointwise,
                               self.window)

    def _kept(self, row: Mapping[str, Any]) -> tuple:
        hist = self.payload(row, False)["history"]
        return tuple(entry_key(e) for e in hist[-self.window:]) if self.window else ()

    def home(self, row: Mapping[str, Any], now_ms: float) -> tuple[int | None, float]:
        """The instance whose user side can serve `row` (`UserResidency.home`) and the share
        of the request's window it holds (1: a hit; less: an append)."""
        got = self.homes.get(str(row.get("user")))
        if got is None or got[1] <= now_ms:
            return None, 0.0
        kept, built = self._kept(row), got[2]
        if not (len(built) <= len(kept) and kept[:len(built)] == built):
            return None, 0.0
        return got[0], len(built) / max(1, len(kept))

    def note(self, row: Mapping[str, Any], index: int, now_ms: float) -> None:
        self.homes[str(row.get("user"))] = (index, now_ms + self.ttl_ms, self._kept(row))

    def view(self, row: Mapping[str, Any], held: list, profile, now_ms: float) -> ClusterView:
        """The policy's view: the router's items per instance, the user's side where it is
        (pointwise), and the prefix picture."""
        home = self.home(row, now_ms)[0] if self.pointwise else None
        key = user_key(str(row.get("user")))
        locality = SetLocality([_WithSide(h, key) if k == home else h
                                for k, h in enumerate(held)])
        return ClusterView(locality, profile, None if self.prefixes is None else
                           PrefixView(self.prefixes, range(len(held))))

    def exact(self, row: Mapping[str, Any], req: RoutingRequest, d: int,
              now_ms: float) -> Exact:
        """What the row finds on instance `d` before the chunk store. The approximation: a
        held segment's real tokens are the row's (history tokens split evenly over its
        window, an item's chunk tokens), ignoring the cache's 16-token blocks."""
        method = row.get("method") or "rcllm"
        if method == "full":
            return Exact()
        hist = float(row.get("history_tokens") or 0)
        if self.pointwise and method in USER_SIDE_METHODS:
            home, share = self.home(row, now_ms)
            if home == d:
                return Exact(0.0, "hit" if share >= 1 else "append",
                             self.instruction + share * hist)
            state = "miss"
        else:
            state = "off"
        n = 0
        if self.prefixes is not None and req.prefix:
            n = int(self.prefixes.matched_tokens(req.prefix, [1] * len(req.prefix), [d])[0])
        h = min(len(row.get("history_items") or ()), self.window)
        items = list(row.get("items") or ())[:max(0, n - h)]
        held = hist * min(n, h) / max(1, h) + sum(self.tokens.get(str(i), 0) for i in items)
        return Exact(self.instruction + held, state, self.instruction + held)

    def answered(self, row: Mapping[str, Any], req: RoutingRequest, d: int,
                 now_ms: float) -> None:
        """After `d` answered `row`: its exact prompt's chain is held there (an inserting
        method), and its user side (a method that reads it, pointwise)."""
        method = row.get("method") or "rcllm"
        if self.prefixes is not None and method in PREFIX_INSERTING:
            self.prefixes.insert(d, req.prefix, req.prefix_tokens)
        if self.pointwise and method in USER_SIDE_METHODS:
            self.note(row, d, now_ms)


def check_policies(policies: Sequence[str]) -> None:
    """RcllmError naming the cells' policies whose picture the replay does not keep."""
    bad = sorted({str(p) for p in policies
                  if p not in REGISTRY or REGISTRY[p].reads not in SIMULABLE_READS})
    if bad:
        known = ", ".join(n for n, s in REGISTRY.items() if s.reads in SIMULABLE_READS)
        raise RcllmError(f"--routing caches simulates the policies {known}; this sweep has "
                         f"cells routed by {', '.join(bad)}, whose picture the replay does "
                         "not keep: predict it with --routing replay or policy")


def prewarm_times(cell: Mapping[str, Any]) -> list[tuple[float, Mapping[str, Any]]]:
    """A relay cell's answered prewarms as (send time in ms, the ranking row they lead), in
    send order; [] without a relay."""
    lead, pre = cell.get("relay_lead_s"), cell.get("prewarm_requests") or []
    if lead is None or not pre:
        return []
    out = [(1e3 * (float(a) - float(lead)), r)
           for a, r, p in zip(cell["arrivals_s"], cell["requests"], pre) if p["status"] == 200]
    return sorted(out, key=lambda x: x[0])


def exact_figures(exacts: list[Exact], rows: list[Mapping[str, Any]],
                  instruction: float) -> dict[str, float | None]:
    """A cell's prefix and user-side hit figures, as `loadgen.cells` measures them."""
    beyond = [max(0.0, e.prefix_tokens - instruction) for e in exacts]
    past = sum(max(0.0, float(r.get("context_tokens") or 0) - instruction) for r in rows)
    sides = [e.user_side for e in exacts if e.user_side != "off"]
    return {"prefix_hit_ratio": sum(beyond) / past if past else None,
            "prefix_hit_requests": (float(np.mean([b > 0 for b in beyond])) if beyond
                                    else None),
            "user_prefix_hit_ratio": (sides.count("hit") / len(sides)) if sides else None,
            "user_prefix_append_ratio": (sides.count("append") / len(sides)) if sides
            else None}
