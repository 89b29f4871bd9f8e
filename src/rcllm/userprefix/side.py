"""The engine's user-side interface: the pointwise prompt's user side, from the user-prefix
cache before the prefill and into it after the answer.

Two calls on the request path and one before it:
- `lookup(req, prompt, reuse)` → a `UserSideLookup` (hit, an earlier history's entry to append
  to, or a miss), or None when the cache does not apply (turned off, a method that reuses
  nothing). Its `match()` is the cached KV in the engine's one look-up shape (`KVMatch`).
- `store(reuse, inp, user, run_behind)`, after the answer: a miss's user side into the cache.
  Stored as served, marked exact when no reused KV went into it (its base, if any, exact too);
  under `reuse.user_side` "behind" an approximate one is replaced by the exact user side
  computed after the answer (an append to an exact base, else one causal forward), through
  `run_behind` (the store's builder thread in serve; at once elsewhere).
- `prewarm(user_id, history)` (RelayGR's pre-inference): the exact user side, stored ahead of
  the user's next ranking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..config import REUSE_METHODS, ReuseConfig, UserPrefixConfig
from ..kvstore.base import KVMatch
from ..model.transformer import Transformer
from ..prefill.selective import PrefillInputs
from ..prompt.builder import Prompt, RankRequest
from ..prompt.pointwise import PointwisePrompt, history_hash
from ..records import HistoryEntry, UserId
from .append import append_prefix
from .cache import PrefixCacheConfig, UserPrefixCache
from .entry import CachedPrefix
from .kv import PrefixKV, StoredKV
from .scoring import compute_prefix


@dataclass(frozen=True)
class UserSideLookup:
    key: str
    user_id: str
    history_hash: str
    entries: int                     # history entries the user side holds
    tokens: int                      # its length (the shared part ends with the block head)
    entry: CachedPrefix | None       # the cached user side, or None: a miss
    base: CachedPrefix | None = None  # on a miss: the user's entry for a prefix of the history

    @property
    def state(self) -> str:
        """hit | append (an earlier history's entry serves its prefix) | miss."""
        return "hit" if self.entry is not None else "append" if self.base is not None else "miss"

    def match(self, dtype: torch.dtype, device) -> KVMatch | None:
        """The cached KV (the entry, else the base) at slots [0, n), or None on a miss."""
        cached = self.entry or self.base
        if cached is None:
            return None
        kv = cached.stored.load(dtype, device)
        n = kv.k.shape[2]
        if n > self.tokens:
            raise RuntimeError("a cached user side longer than the request's")
        return KVMatch("user_prefix", 0, n, ((0, kv.k, kv.v),), n, exact=True)


class UserSides:
    """The user sides of one engine's pointwise requests (model, prompt and cache)."""

    def __init__(self, model: Transformer, prompt: PointwisePrompt, settings: UserPrefixConfig,
                 fingerprint: str, history_window: int):
        self.model, self.prompt, self.history_window = model, prompt, history_window
        self.cache = UserPrefixCache(PrefixCacheConfig.from_settings(settings), fingerprint)

    def lookup(self, req: RankRequest, prompt: Prompt, reuse: ReuseConfig
               ) -> UserSideLookup | None:
        """The request's user side in the cache (entry None on a miss), or None when the cache
        does not apply. Only exactly built entries serve unless `reuse.user_side` is "reuse"."""
        if not reuse.user_prefix or reuse.method not in REUSE_METHODS:
            return None
        kept = tuple(req.history)[prompt.truncated_history:]
        cache = self.cache
        cache.note_request(req.user_id)
        hhash = history_hash(kept)
        key = cache.key(req.user_id, hhash)
        exact = reuse.user_side != "reuse"
        entry = cache.lookup(key, exact=exact)
        base = None
        if entry is None:  # an earlier, shorter history of this user: its user side is a prefix
            base = cache.latest(req.user_id, exact=exact)
            # appends in a row are bounded (INT8 error accumulates): then a full compute
            if base is not None and not (base.entries < len(kept) and
                                         base.appends < cache.cfg.refresh_every and
                                         history_hash(kept[:base.entries]) == base.history_hash):
                base = None
        tokens = len(prompt) - len(self.prompt.head_ids)  # the shared part less the head
        return UserSideLookup(key, req.user_id, hhash, len(kept), tokens, entry, base)

    def store(self, reuse: ReuseConfig, inp: PrefillInputs, user: UserSideLookup,
              run_behind: Callable[[str, Callable[[], None]], object]
              ) -> tuple[int, int] | None:
        """After the answer: a miss's (or an append's) user side into the cache; a hit stores
        nothing. (computed, context) tokens of the exact build when it was queued behind."""
        if user.entry is not None:
            return None
        n, base, cache = user.tokens, user.base, self.cache
        served_exact = (bool((inp.exact_kv[:n] | ~inp.have_kv[:n]).all())
                        and (base is None or base.exact))
        appends = base.appends + 1 if base is not None else 0
        if served_exact or reuse.user_side != "behind":
            kv = PrefixKV(inp.k_buf[:, :, :n].clone(), inp.v_buf[:, :, :n].clone())
            self._put(user, appends, kv, served_exact)
            return None
        ids = inp.ids[:n].tolist()

        def build() -> None:  # under "behind" a base is exact (lookup asks for one)
            if base is not None:
                past = base.stored.load(self.model.dtype, self.model.device)
                kv, count = append_prefix(self.model, past, ids[past.tokens:]), appends
            else:
                kv, count = compute_prefix(self.model, ids), 0
            self._put(user, count, kv, True)

        if not reuse.cache_misses:
            build()  # here, off the clock (bench, eval)
            return None
        if not run_behind(f"user-side:{user.key}", build):
            return None
        done = int(base.stored.k.shape[-2]) if base is not None else 0
        return n - done, n

    def _put(self, user: UserSideLookup, appends: int, kv: PrefixKV, exact: bool) -> None:
        self.cache.put(CachedPrefix(user.key, user.user_id, user.history_hash, user.entries,
                                    appends, StoredKV.of(kv, self.cache.cfg.int8), exact=exact))

    def prewarm(self, user_id: UserId, history: Sequence[HistoryEntry]) -> dict:
        """Computes the user's user side exactly and stores it, so the user's next ranking
        hits; RcllmError when the history is too long."""
        kept = tuple(history)[-self.history_window:] if self.history_window else ()
        side = self.prompt.user_side(user_id, kept)
        key = self.cache.key(user_id, history_hash(kept))
        if self.cache.lookup(key, count=False, exact=True) is not None:
            return {"tokens": len(side.ids), "computed": False}
        kv = compute_prefix(self.model, side.ids)
        self.cache.put(CachedPrefix(key, user_id, side.history_hash, len(kept), 0,
                                    StoredKV.of(kv, self.cache.cfg.int8), exact=True))
        return {"tokens": len(side.ids), "computed": True}
