"""What the HTTP app needs of a deployment (single engine or a Ray cluster)."""

from __future__ import annotations

from typing import Any, Protocol

from ..records import Item


class Backend(Protocol):
    async def rank(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The ranking of `schemas.RankIn.model_dump()`: RankOut's fields. Raises RcllmError
        for bad input, worker.Overloaded when no request can be admitted now."""
        ...

    async def prewarm(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Pre-inference (RelayGR) of `schemas.PrewarmIn.model_dump()` on the instance the
        user's rankings go to: PrewarmOut's fields. Raises RcllmError without the pointwise
        scorer, worker.Overloaded when no request can be admitted now."""
        ...

    def submit_items(self, items: list[Item]) -> int:
        """Queues (re)builds; returns the builds pending after this call."""
        ...

    def delete_item(self, item_id: str) -> bool:
        ...

    def get_item(self, item_id: str) -> tuple[Item | None, bool]:
        """(item requests see now or None, whether a newer version is being built)."""
        ...

    def queue_depth(self) -> int:
        """Requests admitted (waiting or running) over all instances."""
        ...

    def pending(self) -> int:
        """Item builds not yet swapped in."""
        ...

    def ready(self) -> bool:
        ...

    def close(self) -> None:
        ...
