"""One cache entry and its key (shared by the cache and its spill tier)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

from ..records import UserId
from .kv import StoredKV

PrefixKey = NewType("PrefixKey", str)


def prefix_key(user_id: UserId, history_hash: str, fingerprint: str) -> PrefixKey:
    """`user_id:hash(history):model fingerprint` — a history change or a model update gives a
    new key, so a stale prefix can never be served."""
    return PrefixKey(f"{user_id}:{history_hash}:{fingerprint}")


@dataclass(frozen=True)
class CachedPrefix:
    key: PrefixKey
    user_id: UserId
    history_hash: str
    entries: int      # history entries the prefix covers (an append extends from here)
    appends: int      # incremental appends since the last full compute
    stored: StoredKV
    # built exactly (a causal forward of the user side, or an exact append to an exact entry);
    # False when reused history chunks went into it. reuse.user_side "exact"/"behind" serve
    # only exact entries
    exact: bool = False
