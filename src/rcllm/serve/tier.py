"""The router's picture of a shared Redis tier: which catalog items' chunk KV it holds now.

Beside a shared tier an instance reads any item chunk the tier holds in milliseconds, so an
item held there counts as local on every instance (`LiveInstance.view`), beside what each
instance's own memory holds. Uncapped, the tier keeps every chunk written behind to it. Capped
(`maxmemory` with an LRU policy: `bench serve --redis-max-bytes`, or a user's server) it
evicts, and a picture that never learns it counts an evicted item as held everywhere, so
locality cannot pull a request towards the instance whose memory still holds it.

`SharedTier` learns from Redis itself: keyspace notifications of evictions and expirations
(`notify-keyspace-events` with E, e and x; added to the server's flags while the router runs,
and the flags it found put back at `close()`) on a pub/sub connection, read by a thread. Each
(re)subscription first asks the server which item keys exist (one pipelined EXISTS per item),
so a restarted or flushed server is seen too. The thread only queues what it learnt; the
router's event loop applies it (`drain()`, before each routing decision), so the picture is
mutated on the loop alone, like the rest of `views`. An item joins when an instance answers a
request for it (its misses are written behind) or builds it; a loss learnt before such a join
and applied after it does not undo it (each loss carries the time it was received).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Iterable, Mapping

log = logging.getLogger(__name__)

EVENTS = ("evicted", "expired")
_WANTED_FLAGS = "Exe"          # keyevent channel; expired (x) and evicted (e) events


def _flags_with_events(flags: str) -> str:
    """`flags` (a notify-keyspace-events value) plus what eviction and expiry events need."""
    need = set(_WANTED_FLAGS) - ({"x", "e"} if "A" in flags else set())
    return flags + "".join(sorted(need - set(flags)))


class SharedTier:
    """`held`: the catalog items whose chunk KV the tier holds, as far as the router knows.
    `keys` maps each item id to its chunk's Redis key (the instances' `item_redis_keys`)."""

    def __init__(self, client, keys: Mapping[str, str], held: Iterable[str] = (),
                 retry_s: float = 2.0, clock=time.monotonic) -> None:
        self.client = client
        self.held: set[str] = set(held)
        self._item_of: dict[bytes, str] = {}
        self._key_of: dict[str, bytes] = {}
        self.relabel(keys)
        self._clock = clock
        self._added_at: dict[str, float] = {}
        self._gone: deque[tuple[float, str]] = deque()    # (received, item): the thread's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flags_found: str | None = None
        self.retry_s = retry_s
        self.evicted = self.expired = self.resyncs = self.errors = 0
        self.watching = False

    # ---- the router's side (event loop) -------------------------------------------------------
    def relabel(self, keys: Mapping[str, str]) -> None:
        """Items' chunk keys (new items, or updated ones whose text changed)."""
        for item, key in keys.items():
            old = self._key_of.pop(item, None)
            if old is not None:
                self._item_of.pop(old, None)
            raw = key.encode() if isinstance(key, str) else key
            self._key_of[item] = raw
            self._item_of[raw] = item

    def joined(self, keys: Mapping[str, str]) -> None:
        """New or updated items, with their chunk keys, being written to the tier."""
        self.relabel(keys)
        self.added(keys)

    def added(self, items: Iterable[str]) -> None:
        """`items` are (being) written to the tier: an instance answered for them."""
        now = self._clock()
        for item in items:
            self.held.add(item)
            self._added_at[item] = now

    def discard(self, item: str) -> None:
        self.held.discard(item)

    def present(self) -> set[str]:
        """The items whose key the server holds now: one pipelined EXISTS per item (the
        router's start-up, after the instances built their placement into the tier)."""
        items = list(self._key_of.items())
        pipe = self.client.pipeline(transaction=False)
        for _item, key in items:
            pipe.exists(key)
        return {item for (item, _key), there in zip(items, pipe.execute()) if there}

    def drain(self) -> int:
        """Applies the losses the watcher learnt; returns how many items left the picture."""
        n = 0
        while self._gone:
            at, item = self._gone.popleft()
            if item in self.held and at >= self._added_at.get(item, float("-inf")):
                self.held.discard(item)
                n += 1
        return n

    def stats(self, local: list[set[str]] | None = None) -> dict[str, object]:
        """Its counters; with the instances' own memories (`local`), also how many items each
        holds that the tier does not (`tier_missing_held`): where locality can still pull."""
        extra = ({"tier_missing_held": [len(c - self.held) for c in local]}
                 if local is not None else {})
        return {**extra, "tier_items": len(self.held), "tier_evicted": self.evicted,
                "tier_expired": self.expired, "tier_resyncs": self.resyncs,
                "tier_watch_errors": self.errors, "tier_watching": self.watching}

    # ---- the watcher (its own thread) ---------------------------------------------------------
    def start(self) -> "SharedTier":
        """Starts the watcher; returns once its first subscription and resync are done (or
        failed: logged, counted, retried every `retry_s`)."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(ready,), daemon=True,
                                        name="rcllm-tier-watch")
        self._thread.start()
        ready.wait(timeout=10.0)
        return self

    def _events_on(self) -> None:
        """Turns the server's eviction and expiry events on (each connection: a restarted
        server starts without them); the flags first found are put back at `close()`."""
        import redis

        try:
            found = self.client.config_get("notify-keyspace-events").get(
                "notify-keyspace-events", "")
            wanted = _flags_with_events(found)
            if wanted != found:
                self.client.config_set("notify-keyspace-events", wanted)
                if self._flags_found is None:
                    self._flags_found = found
                    log.info("redis notify-keyspace-events %r -> %r while the router runs "
                             "(evictions and expiries of item chunks)", found, wanted)
        except redis.ResponseError as exc:      # CONFIG refused (a managed server)
            self.errors += 1
            log.warning("cannot turn on Redis keyspace events (%s): the router will not learn "
                        "what a capped tier evicts", exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._flags_found is not None:
            try:
                self.client.config_set("notify-keyspace-events", self._flags_found)
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass

    def _watch(self, ready: threading.Event) -> None:
        while not self._stop.is_set():
            try:
                self._subscribed(ready)
                continue                # a restarted server: subscribe to it at once
            except Exception as exc:  # noqa: BLE001 - redis down: retry, counted and logged
                self.errors += 1
                self.watching = False
                log.warning("redis tier watch failed (%s); retrying in %.0f s", exc,
                            self.retry_s)
            ready.set()
            self._stop.wait(self.retry_s)

    def _subscribed(self, ready: threading.Event) -> None:
        """One server's life: events on, subscribed, resynced, then its events until the
        server changes (its run id: a restart, whose keys and flags are gone) or fails."""
        run_id = self.client.info("server")["run_id"]
        self._events_on()
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.psubscribe(*(f"__keyevent@*__:{e}" for e in EVENTS))
            self._resync()
            self.watching = True
            ready.set()
            checked = time.monotonic()
            while not self._stop.is_set():
                msg = pubsub.get_message(timeout=0.5)
                if msg is not None:
                    self._note(msg)
                elif time.monotonic() - checked > 1.0:
                    checked = time.monotonic()
                    if self.client.info("server")["run_id"] != run_id:
                        log.warning("the redis tier restarted: resyncing its picture")
                        return
        finally:
            self.watching = False
            pubsub.close()

    def _resync(self) -> None:
        """Queues every item whose key the server does not hold (after a (re)connect)."""
        now = self._clock()
        there = self.present()
        self._gone.extend((now, item) for item in self._key_of if item not in there)
        self.resyncs += 1

    def _note(self, msg: dict) -> None:
        item = self._item_of.get(msg.get("data"))
        if item is None:        # a review chunk, another program's key
            return
        channel = msg.get("channel") or b""
        if channel.endswith(b"evicted"):
            self.evicted += 1
        else:
            self.expired += 1
        self._gone.append((self._clock(), item))


def open_tier(redis_url: str, keys: Mapping[str, str]) -> SharedTier:
    """The router's picture of the Redis tier at `redis_url` (`keys`: item id → chunk key),
    its watcher started; empty until the instances' placement is built into the tier."""
    import redis

    from ..kvstore.wiring import parse_redis_url

    host, port = parse_redis_url(redis_url)
    client = redis.Redis(host=host, port=port, socket_timeout=5.0, socket_connect_timeout=5.0)
    return SharedTier(client, keys).start()
