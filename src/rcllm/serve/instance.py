"""One Ray instance: an engine host in an actor process (wrapped by `ray.remote` in `router`).

Methods return plain data. Bad input comes back as {"error": message} instead of an
exception, so the router can tell a refused request (answer it) from a dead instance (retry
it elsewhere). The actor is threaded: ranking calls serialise on the host's engine lock while
item and view calls answer at once.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from ..errors import RcllmError
from ..records import Item, ItemId
from .host import EngineHost
from .spec import EngineSpec


class Instance:
    def __init__(self, index: int, spec: EngineSpec) -> None:
        engine, self.dataset = spec.build()
        self.index = index
        self.host = EngineHost(engine)
        self.built = 0

    def ping(self) -> dict[str, Any]:
        """Who this is; `user_prefix_ttl_s`: the longest a user side stays cached (None: no
        user-prefix cache, a listwise scorer); `history_window`: the reviews a prompt keeps
        (the router's residency compares windows); `niceness`: its process's nice value."""
        engine = self.host.engine
        cache = engine.user_prefixes
        ttl = None if cache is None else (cache.cfg.ttl_s or cache.cfg.max_ttl_s)
        return {"index": self.index, "pid": os.getpid(), "built": self.built,
                "user_prefix_ttl_s": ttl, "history_window": engine.cfg.prompt.history_window,
                "niceness": os.nice(0)}

    def calibrate(self, cases: int) -> dict[str, Any]:
        """Timed real rankings for the router's speed profile (`serve.calibrate`): the
        points and the served model's shape, as plain data."""
        from .calibrate import calibration_points, served_model_spec

        with self.host.lock:
            e = self.host.engine
            return {"points": calibration_points(e, self.dataset, cases),
                    "model": dataclasses.asdict(served_model_spec(e))}

    def speed_reference(self) -> float:
        """The reference pass (`model.reference`) timed on this engine once it is free: the
        machine's speed now, for the simulator's prediction of a sweep cell."""
        from ..model.reference import reference_ms

        with self.host.lock:
            return reference_ms(self.host.engine.model)

    def probe(self, timeout_s: float) -> bool:
        """Whether the engine is free within `timeout_s` (its lock could be taken): the
        router re-admits a suspect instance once this answers True. Never waits longer, so
        probes cannot pile up on a stuck instance's threads."""
        if not self.host.lock.acquire(timeout=timeout_s):
            return False
        self.host.lock.release()
        return True

    def prewarm(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The user side into this instance's user-prefix cache; refusals as {"error"}."""
        try:
            out = self.host.prewarm(payload)
        except RcllmError as exc:
            return {"error": str(exc)}
        return {**out, "instance": self.index}

    def holds_user_prefix(self, user_id: str) -> bool:
        return self.host.holds_user_prefix(user_id)

    def user_prefix_stats(self) -> dict[str, float] | None:
        return self.host.user_prefix_stats()

    def store_stats(self) -> dict[str, dict[str, int]]:
        return self.host.store_stats()

    def rank(self, payload: dict[str, Any], imports: list | None = None) -> dict[str, Any]:
        """Ranks `payload` after storing the item KV behind `imports` (object refs of other
        instances' `export_items`); an import that fails (its owner died) is skipped and those
        items are recomputed."""
        t0 = time.perf_counter()
        fetched, import_wait_ms = self._import(imports or [])
        t1 = time.perf_counter()
        try:
            out = self.host.rank(payload)
        except RcllmError as exc:
            return {"error": str(exc)}
        st = out["stats"]
        st["fetched_items"] = fetched
        # time in this actor outside the engine's clock: the imports (object-store fetches of
        # other instances' item KV) split into the waits for an engine lock (`_import`) and
        # the transfer itself, then the wait for the engine lock to rank (`host.rank`)
        st["import_wait_ms"] = import_wait_ms
        st["import_ms"] = max(0.0, (t1 - t0) * 1e3 - import_wait_ms)
        st["actor_ms"] = (time.perf_counter() - t0) * 1e3
        lost = self.host.lost_items()
        if lost is not None:            # item chunks were evicted: the router's picture of
            out["lost_items"] = lost    # this instance drops them
        return {**out, "instance": self.index}

    @staticmethod
    def _fetch(ref) -> dict[str, Any]:
        """The answer of another instance's `export_items` behind `ref`."""
        import ray

        return ray.get(ref, timeout=30)

    def _import(self, refs: list) -> tuple[int, float]:
        """Stores the item KV behind `refs`: (chunks new here, ms spent waiting for an engine
        lock). The wait is the owner's for its lock before exporting (as much of it as this
        fetch lasted: the owner may have waited while an earlier ref was fetched) plus this
        instance's for its own lock to store the KV; the rest of the imports is the transfer."""
        fetched, waited_ms = 0, 0.0
        for ref in refs:
            t0 = time.perf_counter()
            try:
                export = self._fetch(ref)
                got_ms = (time.perf_counter() - t0) * 1e3
                new, own_wait_ms = self.host.import_items(export["rows"])
            except Exception:  # noqa: BLE001 - a dead owner means recompute, not failure
                continue
            fetched += new
            waited_ms += min(float(export["lock_wait_ms"]), got_ms) + own_wait_ms
        return fetched, waited_ms

    def stall(self, seconds: float) -> None:
        """Fault injection for tests: holds the engine lock for `seconds` from another thread
        (this call returns once it is held), so requests pile up in flight."""
        import threading

        held = threading.Event()
        self._release = release = threading.Event()

        def hold() -> None:
            with self.host.lock:
                held.set()
                release.wait(seconds)

        threading.Thread(target=hold, daemon=True).start()
        held.wait()

    def unstall(self) -> None:
        """Ends the current `stall` now."""
        release = getattr(self, "_release", None)
        if release is not None:
            release.set()

    def export_items(self, item_ids: list[str]) -> dict[str, Any]:
        """{"rows": item id → (token ids, K, V), "lock_wait_ms": this engine's lock wait}."""
        rows, waited_ms = self.host.export_items(item_ids)
        return {"rows": rows, "lock_wait_ms": waited_ms}

    def cached_items(self) -> list[str]:
        return self.host.cached_items()

    def build_items(self, items: list[str]) -> int:
        """Builds the chunk KV of `items` (those in the catalog); returns how many were new."""
        built = self.host.build_items(items)
        self.built += built
        return built

    def item_tokens(self) -> dict[str, int]:
        return self.host.item_tokens()

    def submit_items(self, items: list[dict[str, str]]) -> int:
        self.host.submit_items([Item(ItemId(i["item_id"]), i["title"], i["description"],
                                     i["category"]) for i in items])
        return self.host.pending()

    def delete_item(self, item_id: str) -> bool:
        return self.host.delete_item(ItemId(item_id))

    def item(self, item_id: str) -> tuple[dict[str, str] | None, bool]:
        item, pending = self.host.item(ItemId(item_id))
        return (None if item is None else dataclasses.asdict(item)), pending

    def pending(self) -> int:
        return self.host.pending()
