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

# what a ranking's stats say of its item-KV imports (0 when it had none: `Instance._import`)
IMPORT_STATS = ("fetched_items", "import_wait_ms", "import_ms", "imports_late",
                "import_owner_wait_ms")


class Instance:
    def __init__(self, index: int, spec: EngineSpec) -> None:
        engine, self.dataset = spec.build()
        self.index = index
        self.host = EngineHost(engine)
        self.built = 0
        self.prefix_info = self.host.prefix_cache_info()    # fixed from start-up on

    def ping(self) -> dict[str, Any]:
        """Who this is; `user_prefix_ttl_s`: the longest a user side stays cached (None: no
        user-prefix cache, a listwise scorer); `history_window`: the reviews a prompt keeps
        (the router's residency compares windows); `niceness`: its process's nice value;
        `prefix_cache`: what the router's picture of its prefix cache needs
        (`EngineHost.prefix_cache_info`)."""
        engine = self.host.engine
        cache = engine.user_prefixes
        ttl = None if cache is None else (cache.cfg.ttl_s or cache.cfg.max_ttl_s)
        return {"index": self.index, "pid": os.getpid(), "built": self.built,
                "user_prefix_ttl_s": ttl, "history_window": engine.cfg.prompt.history_window,
                "niceness": os.nice(0), "prefix_cache": self.prefix_info}

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

    def rank(self, payload: dict[str, Any], imports: list | None = None,
             import_wait_ms: float = 0.0) -> dict[str, Any]:
        """Ranks `payload`, first storing the item KV behind `imports` (object refs of other
        instances' `export_items`, sent by the router as it chose this instance). The exports
        run while this call waits for its engine; once it holds the engine it waits at most
        `import_wait_ms` more for those not yet here (the router's price of recomputing their
        items instead), then ranks: a late export's items are recomputed, as are those of an
        export whose owner died."""
        t0 = time.perf_counter()
        refs = list(imports or [])
        try:
            out = self.host.rank(payload, (lambda: self._import(refs, import_wait_ms))
                                 if refs else None)
        except RcllmError as exc:
            return {"error": str(exc)}
        st = out["stats"]
        for key in IMPORT_STATS:
            st.setdefault(key, 0)
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

    @staticmethod
    def _arrived(refs: list, timeout_s: float) -> list:
        """Those of `refs` whose answer is here within `timeout_s` (in their order)."""
        import ray

        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout_s))
        done = set(ready)
        return [r for r in refs if r in done]

    def _import(self, refs: list, wait_ms: float) -> dict[str, Any]:
        """Under the engine lock: stores the item KV of those `refs` that arrive within
        `wait_ms`. Stats: `fetched_items` (chunks new here), `import_wait_ms` (this engine
        waiting for exports), `import_ms` (the rest: fetching and storing the KV),
        `imports_late` (exports not waited for), `import_owner_wait_ms` (the owners' waits
        for their own engines before exporting, off this request's path while it queued)."""
        t0 = time.perf_counter()
        arrived = self._arrived(refs, wait_ms / 1e3)
        t1 = time.perf_counter()
        fetched, owner_ms = 0, 0.0
        for ref in arrived:
            try:
                export = self._fetch(ref)
            except Exception:  # noqa: BLE001 - a dead owner means recompute, not failure
                continue
            fetched += self.host.store_rows(export["rows"])
            owner_ms += float(export["lock_wait_ms"])
        return {"fetched_items": fetched, "import_wait_ms": (t1 - t0) * 1e3,
                "import_ms": (time.perf_counter() - t1) * 1e3,
                "imports_late": len(refs) - len(arrived), "import_owner_wait_ms": owner_ms}

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
        """{"rows": item id → (token ids, K, V[, states, layer]), "lock_wait_ms": this
        engine's lock wait}."""
        rows, waited_ms = self.host.export_items(item_ids)
        return {"rows": rows, "lock_wait_ms": waited_ms}

    def cached_items(self) -> list[str]:
        return self.host.cached_items()

    def keep_snapshot(self) -> int:
        return self.host.keep_snapshot()

    def restore_snapshot(self) -> list[str]:
        return self.host.restore_snapshot()

    def item_redis_keys(self, ids: list[str] | None = None) -> dict[str, str]:
        return self.host.item_redis_keys(ids)

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
