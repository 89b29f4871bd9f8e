"""Remote tier on Redis: serialised entries (codec.py) under `prefix + key`.

Redis is an optimisation, never a dependency of correctness: every Redis error or socket
timeout turns a get into a miss and drops a put, counted in `errors`. After an error the tier
stays *open-circuit* for `retry_after_s` (gets miss and puts drop at once, counted in `skipped`)
so a dead or slow server costs one timeout per window, not one per request.

Eviction and TTL are Redis' own (maxmemory-policy allkeys-lru, `ttl_s`); this client keeps a
local index of the entries it wrote or read (key → bytes), which is what `nbytes`/`len` report.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .base import ChunkKey, ChunkKV, InlineBuilds
from .codec import InvalidEntry, KeyCheck, decode, encode_checked
from .latency import TierLatency, timed

log = logging.getLogger(__name__)


class RedisStore(InlineBuilds):
    """KVStore on a Redis server. Thread-safe (redis-py pools connections)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, prefix: str = "rcllm:kv:",
                 check: KeyCheck | None = None, encoding: str = "raw",
                 socket_timeout_s: float = 0.25, retry_after_s: float = 1.0,
                 ttl_s: float | None = None):
        self.prefix = prefix
        self.check = check
        self.encoding = encoding
        self.retry_after_s = retry_after_s
        self.ttl_ms = int(ttl_s * 1000) if ttl_s else None
        self.client = redis.Redis(host=host, port=port, socket_timeout=socket_timeout_s,
                                  socket_connect_timeout=socket_timeout_s,
                                  retry=Retry(NoBackoff(), 0))
        self._index: dict[ChunkKey, int] = {}
        self._nbytes = 0
        self._lock = threading.Lock()
        self._open_until = 0.0  # monotonic time until which the circuit is open
        self.hits = self.misses = self.errors = self.skipped = self.corrupt = self.rejected = 0
        self.latency = TierLatency()

    def redis_key(self, key: ChunkKey) -> str:
        """The Redis key an entry of `key` lives under (the router watches these: serve.tier)."""
        return self.prefix + key

    def _available(self) -> bool:
        if time.monotonic() < self._open_until:
            with self._lock:
                self.skipped += 1
            return False
        return True

    def _failed(self, op: str, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
            self._open_until = time.monotonic() + self.retry_after_s
        log.warning("redis %s failed (%s); treating as a miss for %.1fs", op, exc,
                    self.retry_after_s)

    def _track(self, key: ChunkKey, size: int | None) -> None:
        with self._lock:
            self._nbytes -= self._index.pop(key, 0)
            if size is not None:
                self._index[key] = size
                self._nbytes += size

    @timed("get")
    def get(self, key: ChunkKey) -> ChunkKV | None:
        data = None
        if self._available():
            try:
                data = self.client.get(self.redis_key(key))
            except redis.RedisError as exc:
                self._failed("get", exc)
        if data is None:
            with self._lock:
                self.misses += 1
            return None
        try:
            value = decode(data, key, self.check)
        except InvalidEntry as exc:
            log.warning("dropping invalid KV entry %s from redis: %s", key, exc)
            self._track(key, None)
            with self._lock:
                self.corrupt += 1
                self.misses += 1
            try:
                self.client.delete(self.redis_key(key))
            except redis.RedisError as del_exc:
                self._failed("delete", del_exc)
            return None
        self._track(key, len(data))
        with self._lock:
            self.hits += 1
        return value

    @timed("put")
    def put(self, key: ChunkKey, value: ChunkKV) -> None:
        data = encode_checked(key, value, self.encoding, self.check)
        if data is None:
            with self._lock:
                self.rejected += 1
            return
        if not self._available():
            return
        try:
            self.client.set(self.redis_key(key), data, px=self.ttl_ms)
        except redis.RedisError as exc:
            self._failed("put", exc)
            return
        self._track(key, len(data))

    def put_raw(self, key: ChunkKey, data: bytes) -> None:
        """Stores bytes as-is (tests use it to plant corrupt or mismatched entries)."""
        self.client.set(self.redis_key(key), data)

    def contains(self, key: ChunkKey) -> bool:
        if not self._available():
            return False
        try:
            return bool(self.client.exists(self.redis_key(key)))
        except redis.RedisError as exc:
            self._failed("exists", exc)
            return False

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._index)

    def check_invariants(self) -> None:
        """Local accounting: bytes = sum of tracked entries; counters non-negative."""
        with self._lock:
            assert sum(self._index.values()) == self._nbytes, "byte accounting off"
            assert min(self.hits, self.misses, self.errors, self.skipped, self.corrupt) >= 0

    def close(self) -> None:
        self.client.close()
