"""The single-process backend: one engine behind a bounded queue and one worker thread."""

from __future__ import annotations

import asyncio
from typing import Any

from ..engine import Engine
from ..records import Item, ItemId
from .host import EngineHost
from .worker import EngineWorker


class LocalBackend:
    def __init__(self, engine: Engine, queue_size: int) -> None:
        self.host = EngineHost(engine)
        self.worker = EngineWorker(queue_size)

    async def rank(self, payload: dict[str, Any]) -> dict[str, Any]:
        fut = self.worker.submit(lambda: self.host.rank(payload))   # may raise Overloaded
        out = await asyncio.wrap_future(fut)
        return {**out, "instance": 0}

    async def prewarm(self, payload: dict[str, Any]) -> dict[str, Any]:
        fut = self.worker.submit(lambda: self.host.prewarm(payload))   # may raise Overloaded
        out = await asyncio.wrap_future(fut)
        return {**out, "instance": 0}

    def user_prefix_stats(self) -> dict[str, float] | None:
        """The user-prefix cache's counters (for /metrics), None without the pointwise scorer."""
        return self.host.user_prefix_stats()

    def submit_items(self, items: list[Item]) -> int:
        self.host.submit_items(items)
        return self.host.pending()

    def delete_item(self, item_id: str) -> bool:
        return self.host.delete_item(ItemId(item_id))

    def get_item(self, item_id: str) -> tuple[Item | None, bool]:
        return self.host.item(ItemId(item_id))

    def queue_depth(self) -> int:
        return self.worker.depth

    def pending(self) -> int:
        return self.host.pending()

    def store_stats(self) -> dict[str, dict[str, int]]:
        """Per-tier chunk-store counters (for /metrics)."""
        return self.host.store_stats()

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        self.worker.close()
        self.host.close()
