"""The per-user prefix cache: key `user_id:hash(history):fingerprint`, TTL, LRU by bytes.

- One live entry per user: storing a new key for a user (the history changed) drops the old.
- TTL: `ttl_s` when set, else min(3 × the user's mean request gap, `max_ttl_s`), floored at
  `min_ttl_s`; a user with no gap observed yet gets `max_ttl_s`. Expiry slides: a store or a
  hit sets it to now + the user's current TTL. An expired entry is a miss and is removed.
- A model update (`set_fingerprint`) clears everything, spill tier included.
- LRU by bytes: over `max_bytes`, the least recently used entries are evicted — into the host
  spill tier (the expander) when one is configured, where a later lookup can take them back.
- Singleflight per key: concurrent misses for one user key compute the prefix once.
- Hit rate over all lookups; every `hit_rate_window` lookups a rate below `min_hit_rate` is
  logged as a warning (PAPERS.md §2: under 70% the TTL or the routing is wrong).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ..config import UserPrefixConfig
from ..errors import RcllmError
from ..kvstore.singleflight import SingleFlight, get_or_compute
from ..records import UserId
from .entry import CachedPrefix, PrefixKey, prefix_key
from .expander import HostSpill

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefixCacheConfig:
    max_bytes: int = 1 << 30          # device-tier budget
    ttl_s: float = 0.0                # 0: adaptive min(3 × mean gap, max_ttl_s)
    max_ttl_s: float = 300.0
    min_ttl_s: float = 1.0            # floor of the adaptive TTL (back-to-back requests)
    int8: bool = False                # store INT8 K/V with per-channel scales
    refresh_every: int = 50           # full recompute after this many appends
    spill_bytes: int = 0              # host spill tier budget (the expander); 0 = off
    spill_ttl_s: float = 30.0
    min_hit_rate: float = 0.7
    hit_rate_window: int = 100

    @classmethod
    def from_settings(cls, up: UserPrefixConfig) -> "PrefixCacheConfig":
        """The cache's settings from the engine's `userprefix` config section."""
        return cls(max_bytes=up.max_bytes, ttl_s=up.ttl_s, max_ttl_s=up.max_ttl_s, int8=up.int8,
                   spill_bytes=up.spill_bytes, refresh_every=up.refresh_every)

    def validate(self) -> None:
        if self.max_bytes <= 0 or self.spill_bytes < 0:
            raise RcllmError("userprefix cache: max_bytes must be > 0 and spill_bytes >= 0")
        if min(self.ttl_s, self.min_ttl_s) < 0 or min(self.max_ttl_s, self.spill_ttl_s) <= 0:
            raise RcllmError("userprefix cache: TTLs must be positive (ttl_s 0 = adaptive)")
        if self.refresh_every < 1 or self.hit_rate_window < 1:
            raise RcllmError("userprefix cache: refresh_every and hit_rate_window must be >= 1")


def _servable(entry: CachedPrefix | None, exact: bool) -> CachedPrefix | None:
    """`entry`, or None when only an exactly built entry may serve and it is not one."""
    return None if exact and entry is not None and not entry.exact else entry


@dataclass
class _Gap:
    last_s: float
    total_s: float = 0.0
    count: int = 0


class UserPrefixCache:
    """Thread-safe. `clock` returns seconds (inject a fake one in tests)."""

    def __init__(self, cfg: PrefixCacheConfig, fingerprint: str,
                 clock: Callable[[], float] = time.monotonic):
        cfg.validate()
        self.cfg = cfg
        self.fingerprint = fingerprint
        self._clock = clock
        self._lock = threading.RLock()
        self._entries: OrderedDict[PrefixKey, tuple[CachedPrefix, float]] = OrderedDict()
        self._by_user: dict[UserId, PrefixKey] = {}
        self._gaps: dict[UserId, _Gap] = {}
        self._bytes = 0
        self._flight: SingleFlight[CachedPrefix] = SingleFlight()
        self.spill = HostSpill(cfg.spill_bytes, cfg.spill_ttl_s, clock) if cfg.spill_bytes else None
        self.hits = self.misses = self.expired = self.evictions = self.spill_hits = 0

    # ---- keys, TTL ----------------------------------------------------------------------
    def key(self, user_id: UserId, history_hash: str) -> PrefixKey:
        return prefix_key(user_id, history_hash, self.fingerprint)

    def note_request(self, user_id: UserId) -> None:
        """Records a request time of `user_id` (feeds the adaptive TTL)."""
        now = self._clock()
        with self._lock:
            gap = self._gaps.get(user_id)
            if gap is None:
                self._gaps[user_id] = _Gap(now)
            else:
                gap.total_s += now - gap.last_s
                gap.count += 1
                gap.last_s = now

    def ttl_s(self, user_id: UserId) -> float:
        if self.cfg.ttl_s:
            return self.cfg.ttl_s
        gap = self._gaps.get(user_id)
        if gap is None or gap.count == 0:
            return self.cfg.max_ttl_s
        return max(self.cfg.min_ttl_s, min(3.0 * gap.total_s / gap.count, self.cfg.max_ttl_s))

    # ---- lookups ------------------------------------------------------------------------
    def lookup(self, key: PrefixKey, count: bool = True,
               exact: bool = False) -> CachedPrefix | None:
        """The live entry for `key` or None. Checks the device tier, then the spill tier (a
        spill hit moves the entry back). `count`: whether it enters the hit rate (a prewarm's
        lookup does not: it exists to make the later ranking lookup hit). `exact`: only an
        entry built exactly is served; an approximate one is a miss (left for the exact entry
        that replaces it to drop)."""
        entry = _servable(self._peek(key), exact)
        if not count:
            return entry
        with self._lock:
            if entry is not None:
                self.hits += 1
            else:
                self.misses += 1
            self._maybe_warn()
        return entry

    def _peek(self, key: PrefixKey) -> CachedPrefix | None:
        with self._lock:
            item = self._entries.get(key)
            if item is not None:
                now = self._clock()
                if item[1] > now:  # sliding expiry: a hit re-arms the user's current TTL
                    self._entries[key] = (item[0], now + self.ttl_s(item[0].user_id))
                    self._entries.move_to_end(key)
                    return item[0]
                self._drop(key)
                self.expired += 1
        if self.spill is not None:
            entry = self.spill.take(key)
            if entry is not None:
                with self._lock:
                    self.spill_hits += 1
                self.put(entry)
                return entry
        return None

    def latest(self, user_id: UserId, exact: bool = False) -> CachedPrefix | None:
        """The user's live entry whatever its history (the base of an append), or None.
        Not counted in the hit rate. `exact`: only an entry built exactly."""
        return _servable(self._latest(user_id), exact)

    def _latest(self, user_id: UserId) -> CachedPrefix | None:
        with self._lock:
            key = self._by_user.get(user_id)
        if key is not None:
            entry = self._peek(key)
            if entry is not None:
                return entry
        if self.spill is not None:
            entry = self.spill.take_user(user_id)
            if entry is not None and entry.key.endswith(":" + self.fingerprint):
                self.put(entry)
                return entry
        return None

    def get_or_compute(self, key: PrefixKey, compute: Callable[[], CachedPrefix],
                       count: bool = True) -> CachedPrefix:
        """A hit, or `compute()` run once per key however many threads miss together; the
        result is stored. Exceptions from `compute` reach every waiting caller."""
        return get_or_compute(self._flight, key, lambda: self.lookup(key, count),
                              lambda: self._peek(key), compute, self.put)

    # ---- mutation -----------------------------------------------------------------------
    def put(self, entry: CachedPrefix) -> bool:
        """Stores `entry` as its user's only entry (LRU-evicting as needed). An entry larger
        than `max_bytes` is not stored (False)."""
        if not entry.key.endswith(":" + self.fingerprint):
            return False  # computed under an older model
        size = entry.stored.nbytes
        with self._lock:
            old = self._by_user.get(entry.user_id)
            if old is not None:
                self._drop(old)
            if size > self.cfg.max_bytes:
                log.debug("prefix of %s (%d bytes) exceeds the cache budget", entry.user_id, size)
                return False
            expires = self._clock() + self.ttl_s(entry.user_id)
            self._entries[entry.key] = (entry, expires)
            self._by_user[entry.user_id] = entry.key
            self._bytes += size
            while self._bytes > self.cfg.max_bytes:
                victim = next(iter(self._entries))
                spilled = self._entries[victim][0]
                self._drop(victim)
                self.evictions += 1
                if self.spill is not None:
                    self.spill.put(spilled)
            return True

    def invalidate_user(self, user_id: UserId) -> None:
        with self._lock:
            key = self._by_user.get(user_id)
            if key is not None:
                self._drop(key)

    def set_fingerprint(self, fingerprint: str) -> None:
        """A model update: every entry (both tiers) is dropped."""
        with self._lock:
            self.fingerprint = fingerprint
            self._entries.clear()
            self._by_user.clear()
            self._bytes = 0
            if self.spill is not None:
                self.spill.clear()

    def _drop(self, key: PrefixKey) -> None:
        entry, _ = self._entries.pop(key)
        self._bytes -= entry.stored.nbytes
        if self._by_user.get(entry.user_id) == key:
            del self._by_user[entry.user_id]

    # ---- metrics ------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def _maybe_warn(self) -> None:
        total = self.hits + self.misses
        if total % self.cfg.hit_rate_window == 0 and self.hit_rate < self.cfg.min_hit_rate:
            log.warning("user-prefix cache hit rate %.0f%% over %d lookups is below %.0f%%: "
                        "check the TTL and the affinity routing", 100 * self.hit_rate, total,
                        100 * self.cfg.min_hit_rate)

    def stats(self) -> dict[str, float]:
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hit_rate,
                "expired": self.expired, "evictions": self.evictions,
                "spill_hits": self.spill_hits, "entries": len(self), "bytes": self.nbytes,
                "singleflight_shared": self._flight.shared}

    def check_invariants(self) -> None:
        with self._lock:
            total = sum(e.stored.nbytes for e, _ in self._entries.values())
            assert total == self._bytes, f"cache bytes {self._bytes} != entries {total}"
            assert self._bytes <= self.cfg.max_bytes, "cache over its byte budget"
            assert len(self._by_user) == len(self._entries), "user index out of step"
            for user, key in self._by_user.items():
                assert self._entries[key][0].user_id == user, f"user index wrong for {user}"
                assert key.endswith(":" + self.fingerprint), f"stale fingerprint in {key}"
        if self.spill is not None:
            self.spill.check_invariants()
