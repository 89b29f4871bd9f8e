"""One Ray instance: an engine host in an actor process (wrapped by `ray.remote` in `router`).

Methods return plain data. Bad input comes back as {"error": message} instead of an
exception, so the router can tell a refused request (answer it) from a dead instance (retry
it elsewhere). The actor is threaded: ranking calls serialise on the host's engine lock while
item and view calls answer at once.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..errors import RcllmError
from ..records import Item, ItemId
from .host import EngineHost
from .spec import EngineSpec


class Instance:
    def __init__(self, index: int, spec: EngineSpec) -> None:
        engine, _ds = spec.build()
        self.index = index
        self.host = EngineHost(engine)
        self.built = 0

    def ping(self) -> dict[str, int]:
        return {"index": self.index, "pid": os.getpid(), "built": self.built}

    def rank(self, payload: dict[str, Any], imports: list | None = None) -> dict[str, Any]:
        """Ranks `payload` after storing the item KV behind `imports` (object refs of other
        instances' `export_items`); an import that fails (its owner died) is skipped and those
        items are recomputed."""
        fetched = self._import(imports or [])
        try:
            out = self.host.rank(payload)
        except RcllmError as exc:
            return {"error": str(exc)}
        out["stats"]["fetched_items"] = fetched
        return {**out, "instance": self.index}

    def _import(self, refs: list) -> int:
        import ray

        fetched = 0
        for ref in refs:
            try:
                fetched += self.host.import_items(ray.get(ref, timeout=30))
            except Exception:  # noqa: BLE001 - a dead owner means recompute, not failure
                continue
        return fetched

    def stall(self, seconds: float) -> None:
        """Fault injection for tests: holds the engine lock for `seconds` from another thread
        (this call returns once it is held), so requests pile up in flight."""
        import threading

        held = threading.Event()

        def hold() -> None:
            with self.host.lock:
                held.set()
                threading.Event().wait(seconds)

        threading.Thread(target=hold, daemon=True).start()
        held.wait()

    def export_items(self, item_ids: list[str]) -> dict[str, tuple]:
        return self.host.export_items(item_ids)

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
