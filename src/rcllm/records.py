"""The common data model every dataset loader produces and every prompt consumes.

Plain frozen dataclasses with no torch: the simulator, the catalog sharding and the HTTP layer
use them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType

ItemId = NewType("ItemId", str)
UserId = NewType("UserId", str)


@dataclass(frozen=True)
class Item:
    item_id: ItemId
    title: str
    description: str = ""
    category: str = ""


@dataclass(frozen=True)
class HistoryEntry:
    """One past interaction of a user: the item, its rating, the review text and when."""

    item_id: ItemId
    rating: float
    review: str
    timestamp: int  # seconds since the epoch


@dataclass
class Dataset:
    """Items by id and, per user, the history in time order (oldest first).

    `skipped` counts records a loader could not use, by reason, so reports can show them: a
    loader never drops data silently.
    """

    name: str
    items: dict[ItemId, Item]
    users: dict[UserId, list[HistoryEntry]]
    skipped: dict[str, int] = field(default_factory=dict)

    def check_invariants(self) -> None:
        for user, hist in self.users.items():
            times = [h.timestamp for h in hist]
            assert times == sorted(times), f"history of {user} is not time-ordered"
            for h in hist:
                assert h.item_id in self.items, f"history of {user} names unknown item {h.item_id}"
