"""The pointwise ranker: prompt + prefix cache + batched scoring, with incremental appends.

`score(user, history, candidates)` builds the user side, gets its prefix from the cache (one
compute per user key, singleflight), and scores every candidate in one batched pass. On a miss
the prefix is built incrementally when the cache still holds the user's previous prefix and
that prefix's history is a prefix of the new history: only the new entries run (forward with
past). After `refresh_every` appends in a row the next change is a full recompute, which bounds
the drift an INT8 past accumulates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..model.loading import LoadedModel
from ..records import HistoryEntry, ItemId, UserId
from .append import append_prefix
from .cache import UserPrefixCache
from .entry import CachedPrefix
from .kv import PrefixKV, StoredKV
from ..prompt.pointwise import PointwisePrompt, UserSide, history_hash
from .scoring import compute_prefix, score_batched


@dataclass(frozen=True)
class Scored:
    scores: list[float]   # P(yes) per candidate, in candidate order
    prefix_tokens: int
    cached: bool          # the prefix came from the cache (no prefix compute)


class UserPrefixRanker:
    def __init__(self, loaded: LoadedModel, prompt: PointwisePrompt, cache: UserPrefixCache):
        self.loaded = loaded
        self.prompt = prompt
        self.cache = cache
        self.full_computes = 0
        self.appends = 0

    @property
    def model(self):
        return self.loaded.model

    def set_model(self, loaded: LoadedModel) -> None:
        """A model update: new weights, and every cached prefix invalidated."""
        self.loaded = loaded
        self.cache.set_fingerprint(loaded.fingerprint)

    def prefix(self, user_id: UserId, history: Sequence[HistoryEntry], count: bool = True
               ) -> tuple[PrefixKV, UserSide, bool]:
        """(the user side's KV, the user side, whether it was a cache hit). `count`: the
        lookup enters the hit rate (False for prewarms)."""
        side = self.prompt.user_side(user_id, history)
        key = self.cache.key(user_id, side.history_hash)
        computed = []

        def compute() -> CachedPrefix:
            computed.append(True)
            return self._build(side, history)

        entry = self.cache.get_or_compute(key, compute, count)
        kv = entry.stored.load(self.model.dtype, self.model.device)
        return kv, side, not computed

    def _build(self, side: UserSide, history: Sequence[HistoryEntry]) -> CachedPrefix:
        base = self.cache.latest(side.user_id)
        refresh = self.cache.cfg.refresh_every
        if (base is not None and base.entries <= len(history) and base.appends < refresh
                and history_hash(history[: base.entries]) == base.history_hash):
            past = base.stored.load(self.model.dtype, self.model.device)
            kv = append_prefix(self.model, past, self.prompt.history_ids(history[base.entries:]))
            appends = base.appends + 1
            self.appends += 1
        else:
            kv = compute_prefix(self.model, side.ids)
            appends = 0
            self.full_computes += 1
        return CachedPrefix(self.cache.key(side.user_id, side.history_hash), side.user_id,
                            side.history_hash, side.entries, appends,
                            StoredKV.of(kv, self.cache.cfg.int8), exact=True)

    def score(self, user_id: UserId, history: Sequence[HistoryEntry],
              candidates: Sequence[ItemId]) -> Scored:
        """Scores `candidates` for the user; RcllmError for an unknown item or a prefix over
        the limit."""
        self.cache.note_request(user_id)
        suffixes = [self.prompt.candidate_ids(c) for c in candidates]
        kv, side, hit = self.prefix(user_id, history)
        probs = score_batched(self.model, kv, suffixes, self.prompt.yes_id, self.prompt.no_id)
        return Scored([float(p) for p in probs], len(side.ids), hit)
