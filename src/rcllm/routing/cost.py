"""The TTFT cost model shared by the simulator and the router.

TTFT = queue wait + prefill(computed tokens, context) + transfer(reused KV bytes / tier
bandwidth) − overlap, where overlap = min(transfer, overlap_fraction · prefill): RcLLM loads
reused KV layer by layer while earlier layers compute. What is computed and what is reused
depends on the method (`work`):

- full:   every token computed.
- prefix: the shared instruction prefix is reused from GPU memory (exact Prefix-Cache); the
          rest is computed.
- rcllm:  instruction and request-specific tokens computed; history tokens with a prototype
          match and items cached on the instance are reused (loaded over PCIe from host
          memory), a fraction `history_ratio` / `item_ratio` of them recomputed; items on other
          instances are recomputed, or fetched over the network when `remote_items="fetch"`.

Every function accepts `local_item_tokens` as a scalar or as an array over instances and then
returns arrays, so a policy can price all instances in one numpy expression.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from ..errors import RcllmError
from .profiles import SpeedProfile

METHODS = ("full", "prefix", "rcllm")
Num = Union[float, np.ndarray]


@dataclass(frozen=True)
class MethodConfig:
    """How a request is served: the method and RcLLM's recompute budgets."""

    method: str = "rcllm"
    item_ratio: float = 0.3
    history_ratio: float = 0.3
    remote_items: str = "recompute"   # recompute | fetch (over the network from the shard)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise RcllmError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        for name in ("item_ratio", "history_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise RcllmError(f"{name} must be within [0, 1]")
        if self.remote_items not in ("recompute", "fetch"):
            raise RcllmError("remote_items must be 'recompute' or 'fetch'")


@dataclass(frozen=True)
class RequestShape:
    """Token counts of one prompt by segment kind (what the cost model needs of a request)."""

    prefix_tokens: int        # shared task instruction: the only part Prefix-Cache reuses
    fresh_tokens: int         # request-specific bits and the question: always computed
    history_tokens: int
    history_hit_tokens: int   # history tokens whose review matched a cached prototype
    item_tokens: int          # all candidate item text
    # the request's own recompute budgets (a /v1/rank payload's item_ratio / history_ratio);
    # None: the cost model's method config
    item_ratio: float | None = None
    history_ratio: float | None = None

    @property
    def context_tokens(self) -> int:
        return self.prefix_tokens + self.fresh_tokens + self.history_tokens + self.item_tokens


@dataclass(frozen=True)
class Work:
    """What one request costs an instance; fields are scalars or per-instance arrays."""

    computed_tokens: Num
    reused_tokens: Num
    context_tokens: int
    host_bytes: Num
    network_bytes: Num


class CostModel:
    """Prices requests for one (profile, method) pair. Stateless; safe to share."""

    def __init__(self, profile: SpeedProfile, method: MethodConfig) -> None:
        self.profile = profile
        self.method = method
        self._reuse_ms = float(profile.reuse_ms_per_token.get(method.method, 0.0))
        self._kv_bytes = profile.model.kv_bytes_per_token

    def work(self, shape: RequestShape, local_item_tokens: Num) -> Work:
        """Computed / reused tokens and bytes when `local_item_tokens` of the items are local."""
        ctx = shape.context_tokens
        m = self.method
        if m.method == "full":
            return Work(ctx, 0, ctx, 0, 0)
        if m.method == "prefix":
            return Work(ctx - shape.prefix_tokens, shape.prefix_tokens, ctx, 0, 0)
        local = np.minimum(local_item_tokens, shape.item_tokens)
        remote = shape.item_tokens - local
        fetched = remote if m.remote_items == "fetch" else 0 * remote
        reused_items = local + fetched
        hist_hit = shape.history_hit_tokens
        item_ratio = m.item_ratio if shape.item_ratio is None else shape.item_ratio
        history_ratio = m.history_ratio if shape.history_ratio is None else shape.history_ratio
        computed = (shape.prefix_tokens + shape.fresh_tokens
                    + (shape.history_tokens - hist_hit) + (remote - fetched)
                    + item_ratio * reused_items + history_ratio * hist_hit)
        host = (local + hist_hit) * self._kv_bytes
        return Work(computed, reused_items + hist_hit, ctx, host, fetched * self._kv_bytes)

    def prefill_ms(self, work: Work) -> Num:
        p = self.profile
        return (p.fixed_ms + work.computed_tokens * (p.ms_per_token
                                                     + p.ms_per_token_ctx * work.context_tokens)
                + self._reuse_ms * work.reused_tokens)

    def transfer_ms(self, work: Work) -> Num:
        p = self.profile
        return (work.host_bytes / p.host_bytes_per_s
                + work.network_bytes / p.network_bytes_per_s) * 1e3

    def service_ms(self, work: Work) -> Num:
        """Prefill plus the part of the transfer that computation cannot hide."""
        prefill = self.prefill_ms(work)
        transfer = self.transfer_ms(work)
        return prefill + transfer - np.minimum(transfer, self.profile.overlap_fraction * prefill)

    def ttft_ms(self, shape: RequestShape, local_item_tokens: Num, wait_ms: Num) -> Num:
        """Estimated TTFT on instances with the given local item tokens and queue waits."""
        return wait_ms + self.service_ms(self.work(shape, local_item_tokens))
