"""Collects items and interactions from a loader and builds a clean `Dataset`.

Build rules, shared by every file-based loader (reasons are the keys of `Dataset.skipped`):
- "duplicate_line": an interaction identical in every field to an earlier one (the Amazon 2018
  Magazine file has 42 such lines) is dropped;
- "duplicate_user_item": a second, different interaction of the same user with the same item
  is dropped; the first in file order is kept (leave-last-out needs one entry per pair);
- "unknown_item": an interaction whose item has no usable metadata is dropped (a candidate or
  history item without text cannot be put in a prompt);
- "item_without_interactions": metadata rows of items nobody interacted with are not kept
  unless keep_unused_items=True (metadata files cover whole categories).
Histories are sorted by timestamp with a stable sort, so equal timestamps keep file order.
"""

from __future__ import annotations

from collections import Counter

from rcllm.records import Dataset, HistoryEntry, Item, ItemId, UserId


class DatasetBuilder:
    """Accumulates records in file order; `build()` applies the rules above once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: dict[ItemId, Item] = {}
        self.skipped: Counter[str] = Counter()
        self._interactions: list[tuple[UserId, HistoryEntry]] = []

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] += n

    def add_item(self, item: Item) -> None:
        """Adds an item; a second row for the same id is counted and ignored (first wins)."""
        if item.item_id in self.items:
            self.skipped["duplicate_item_metadata"] += 1
            return
        self.items[item.item_id] = item

    def add_interaction(self, user: str, item: str, rating: float, review: str,
                        timestamp: int) -> None:
        self._interactions.append(
            (UserId(user), HistoryEntry(ItemId(item), float(rating), review, int(timestamp))))

    def interacted_items(self) -> set[ItemId]:
        """Items named by the interactions added so far (lets loaders read only needed meta)."""
        return {entry.item_id for _, entry in self._interactions}

    def build(self, keep_unused_items: bool = False) -> Dataset:
        seen_lines: set[tuple[UserId, HistoryEntry]] = set()
        seen_pairs: set[tuple[UserId, ItemId]] = set()
        users: dict[UserId, list[HistoryEntry]] = {}
        for user, entry in self._interactions:
            if (user, entry) in seen_lines:
                self.skipped["duplicate_line"] += 1
                continue
            seen_lines.add((user, entry))
            if (user, entry.item_id) in seen_pairs:
                self.skipped["duplicate_user_item"] += 1
                continue
            seen_pairs.add((user, entry.item_id))
            if entry.item_id not in self.items:
                self.skipped["unknown_item"] += 1
                continue
            users.setdefault(user, []).append(entry)
        for hist in users.values():
            hist.sort(key=lambda e: e.timestamp)  # stable: ties keep file order
        items = self.items
        if not keep_unused_items:
            used = {e.item_id for hist in users.values() for e in hist}
            unused = len(items) - len(used)
            if unused:
                self.skipped["item_without_interactions"] += unused
            items = {i: it for i, it in items.items() if i in used}
        return Dataset(self.name, items, users, dict(sorted(self.skipped.items())))
