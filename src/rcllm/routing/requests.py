"""A /v1/rank payload as routing policies see it (`RoutingRequest`): the router's and the
simulator's one translation, so a replay of a served sweep routes on what the router saw.

Token estimates for routing only (the engine counts real tokens); a request's own items use the
counts the instances report when known. The prompt's prefix chain (`prefix_segments`,
`prefixes.prefix_chain`) is what prefix-aware routing matches.
"""

from __future__ import annotations

import numpy as np

from .cost import RequestShape
from .prefixes import prefix_chain
from .views import RoutingRequest

PREFIX_TOKENS, TOKENS_PER_HISTORY, TOKENS_PER_ITEM, HISTORY_WINDOW = 60, 60, 64, 10


def user_key(user_id: str) -> tuple[str, str]:
    """The routing "item" of a user's user side (a tuple: never equal to a catalog id)."""
    return ("user-prefix", user_id)


def is_user_key(item: object) -> bool:
    """Whether a routing "item" is a user side (`user_key`), not a catalog id."""
    return isinstance(item, tuple) and len(item) == 2 and item[0] == "user-prefix"


def entry_key(entry: dict | str) -> tuple:
    """A history entry of a payload as the engine's history hash sees it (its content); an
    entry given by its item id alone (what a served sweep's rows keep, `history_items`, which
    the simulator replays) is that id."""
    if not isinstance(entry, dict):
        return (str(entry),)
    return (str(entry.get("item_id")), entry.get("rating"), entry.get("timestamp"),
            entry.get("review"))


def prefix_segments(payload: dict, item_tokens: dict[str, int], history_window: int,
                    candidates: bool) -> tuple[list[tuple], list[int]]:
    """The prompt's segments after the instruction, in prompt order, with their estimated
    tokens: the history window's entries, then (`candidates`: a listwise prompt, whose whole
    shared part enters the prefix cache) the candidates; a pointwise prompt's prefix ends
    with the history (its candidate blocks are not prefix-cached)."""
    kept = list(payload.get("history", ()))[-history_window:] if history_window else []
    segs: list[tuple] = [("history", entry_key(e)) for e in kept]
    tokens = [TOKENS_PER_HISTORY] * len(segs)
    if candidates:
        cands = list(payload.get("candidates", ()))
        segs += [("item", str(i)) for i in cands]
        tokens += [item_tokens.get(i, TOKENS_PER_ITEM) for i in cands]
    return segs, tokens


def routing_request(payload: dict, item_tokens: dict[str, int], user_side: bool = False,
                    history_window: int = HISTORY_WINDOW) -> RoutingRequest:
    """The policy's picture of a /v1/rank (or, without candidates, /v1/prewarm) payload. With
    `user_side` (a pointwise deployment) the instruction and history form one more item,
    `user_key(user)`, reusable where that user side is resident. Its prefix chain covers the
    last `history_window` history entries (the engine's `prompt.history_window`)."""
    segs, seg_tokens = prefix_segments(payload, item_tokens, history_window, not user_side)
    chain = prefix_chain(segs)
    items: list = list(payload.get("candidates", ()))
    tokens = [item_tokens.get(i, TOKENS_PER_ITEM) for i in items]
    hist = min(len(payload["history"]), HISTORY_WINDOW) * TOKENS_PER_HISTORY
    fresh = 20 + 4 * len(items)
    # priced at the budgets the request names (the engine's defaults where it names none)
    ratios = {k: float(payload[k]) for k in ("item_ratio", "history_ratio")
              if payload.get(k) is not None}
    if user_side:
        items.insert(0, user_key(payload["user_id"]))
        tokens.insert(0, PREFIX_TOKENS + hist)
        shape = RequestShape(prefix_tokens=0, fresh_tokens=fresh, history_tokens=0,
                             history_hit_tokens=0, item_tokens=sum(tokens), **ratios)
    else:
        shape = RequestShape(prefix_tokens=PREFIX_TOKENS, fresh_tokens=fresh,
                             history_tokens=hist, history_hit_tokens=hist,
                             item_tokens=sum(tokens), **ratios)
    return RoutingRequest(shape, items, np.asarray(tokens, dtype=np.int64), chain,
                          tuple(seg_tokens))
