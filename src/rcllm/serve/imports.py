"""Which item KV the router moves between instances, and how long it is worth waiting for.

An instance lacking some of a request's items may import their chunk KV from an instance that
holds it (Ray's object store, owner → importer, never through the router) instead of
recomputing it. The router asks each owner to export while the request queues on the chosen
instance; the chosen instance waits for the exports only as long as they save
(`Instance._import`). Not beside a shared Redis tier: there every instance reads any chunk
from the tier in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..config import REUSE_METHODS
from ..routing import CostModel
from ..routing.balance import import_saving_ms
from .spec import EngineSpec
from .views import LiveInstance


def imports_item_kv(spec: EngineSpec, fetch_remote: bool = True) -> bool:
    """Whether the router moves item KV between instances through Ray's object store. Not
    with a shared Redis tier: every instance's chunks are written behind to it and read
    through from it, while an export waits on the owner's engine lock (up to 1 s)."""
    return fetch_remote and not spec.redis_url


def import_plan(fetch_cost: CostModel, inst: LiveInstance, request, local_tokens: float,
                recompute_ms: float, instances: Sequence[LiveInstance]
                ) -> tuple[dict[int, list[str]], float]:
    """({owner index: the request's items `inst` lacks and that owner holds}, the most `inst`
    should wait for them once its engine is free, ms): empty when the cost model prices
    fetching the missing items at or above recomputing them (`recompute_ms`: the request's
    service on `inst` as the router estimated it). The wait bound is what the imports save,
    recompute minus fetch (`routing.balance.import_saving_ms`): waiting longer costs more
    than recomputing."""
    saving = import_saving_ms(fetch_cost, request.shape, local_tokens, recompute_ms)
    if saving <= 0:
        return {}, 0.0
    by_owner: dict[int, list[str]] = {}
    for item in request.items:
        if not isinstance(item, str) or item in inst.cached:   # a user side: not fetched
            continue
        owner = next((o for o in instances
                      if o.usable and o is not inst and item in o.cached), None)
        if owner is not None:
            by_owner.setdefault(owner.index, []).append(item)
    return by_owner, (saving if by_owner else 0.0)


@dataclass
class ItemImports:
    """The router's import decision for one routed request (`plan`)."""

    fetch_cost: CostModel       # the router's cost model with remote items fetched
    enabled: bool               # `imports_item_kv`: False beside a shared tier or when off
    default_method: str         # the method of a request that names none
    # the least an importer waits for an export, whatever the cost model says it saves (0; a
    # test on a tiny model, whose recompute costs less than a Ray round trip, sets it)
    wait_floor_ms: float = 0.0

    def plan(self, inst: LiveInstance, request, local_tokens: float, estimate_ms: float,
             method: str | None, instances: Sequence[LiveInstance]
             ) -> tuple[dict[int, list[str]], float]:
        """`import_plan` for `request` on `inst` ({owner: items}, the most `inst` waits for
        them); none for a method that reads no item KV (full, prefix) or when imports are
        off."""
        if not self.enabled or (method or self.default_method) not in REUSE_METHODS:
            return {}, 0.0
        plan, wait_ms = import_plan(self.fetch_cost, inst, request, local_tokens, estimate_ms,
                                    instances)
        return plan, (max(wait_ms, self.wait_floor_ms) if plan else 0.0)
