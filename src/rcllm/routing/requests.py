"""A /v1/rank payload as routing policies see it (`RoutingRequest`): the router's and the
simulator's one translation, so a replay of a served sweep routes on what the router saw.

Token estimates for routing only (the engine counts real tokens); a request's own items use the
counts the instances report when known.
"""

from __future__ import annotations

import numpy as np

from .cost import RequestShape
from .views import RoutingRequest

PREFIX_TOKENS, TOKENS_PER_HISTORY, TOKENS_PER_ITEM, HISTORY_WINDOW = 60, 60, 64, 10


def user_key(user_id: str) -> tuple[str, str]:
    """The routing "item" of a user's user side (a tuple: never equal to a catalog id)."""
    return ("user-prefix", user_id)


def routing_request(payload: dict, item_tokens: dict[str, int],
                    user_side: bool = False) -> RoutingRequest:
    """The policy's picture of a /v1/rank (or, without candidates, /v1/prewarm) payload. With
    `user_side` (a pointwise deployment) the instruction and history form one more item,
    `user_key(user)`, reusable where that user side is resident."""
    items: list = list(payload.get("candidates", ()))
    tokens = [item_tokens.get(i, TOKENS_PER_ITEM) for i in items]
    hist = min(len(payload["history"]), HISTORY_WINDOW) * TOKENS_PER_HISTORY
    fresh = 20 + 4 * len(items)
    if user_side:
        items.insert(0, user_key(payload["user_id"]))
        tokens.insert(0, PREFIX_TOKENS + hist)
        shape = RequestShape(prefix_tokens=0, fresh_tokens=fresh, history_tokens=0,
                             history_hit_tokens=0, item_tokens=sum(tokens))
    else:
        shape = RequestShape(prefix_tokens=PREFIX_TOKENS, fresh_tokens=fresh,
                             history_tokens=hist, history_hit_tokens=hist,
                             item_tokens=sum(tokens))
    return RoutingRequest(shape, items, np.asarray(tokens, dtype=np.int64))
