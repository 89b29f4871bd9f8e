"""The simulated chunk stores of a served sweep's instances (`served_cache`'s replay, issue 51
item 4): per instance an item store and a review store, each least recently used by bytes as
the engine's `kvstore.MemoryLRUStore`, the router's picture of what each holds, and what a
request finds and leaves in them. Plain Python: no model, no torch."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import ReuseConfig
from ..errors import RcllmError

HISTORY_BYTES = 1 << 30     # serve's memory for review chunks (`EngineSpec.history_bytes`)


class StoreSim:
    """One instance's chunk store: least recently used by bytes (`kvstore.MemoryLRUStore`)."""

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self.entries: OrderedDict[tuple, int] = OrderedDict()
        self.nbytes = 0
        self.items: set[str] = set()      # the item ids among the entries (the router's view)

    def __contains__(self, key: tuple) -> bool:
        return key in self.entries

    def touch(self, key: tuple) -> None:
        self.entries.move_to_end(key)

    def put(self, key: tuple, nbytes: int) -> None:
        """Stores (or refreshes) `key`, evicting the least recent entries past the budget; an
        entry larger than the whole budget is not kept."""
        if key in self.entries:
            self.touch(key)
            return
        if nbytes > self.budget:
            return
        self.entries[key] = int(nbytes)
        self.nbytes += int(nbytes)
        if key[0] == "item":
            self.items.add(key[1])
        while self.nbytes > self.budget:
            gone, size = self.entries.popitem(last=False)
            self.nbytes -= size
            if gone[0] == "item":
                self.items.discard(gone[1])


@dataclass
class Look:
    """What one request found at its instance: chunk hits and look-ups, item tokens served from
    the store, history tokens served, and the chunks built behind its answer."""

    hits: int = 0
    lookups: int = 0
    item_hit_tokens: float = 0.0
    item_tokens: float = 0.0
    history_hit_tokens: float = 0.0
    imported: int = 0
    built: list[tuple[tuple, int, int]] = field(default_factory=list)   # (key, tokens, bytes)


class ClusterCaches:
    """Every instance's store, and what a request finds and leaves in them."""

    def __init__(self, sweep: Mapping[str, Any], kv_bytes_per_token: int) -> None:
        if sweep.get("redis_tier"):
            raise RcllmError("--routing caches models a sweep without the shared tier (run with "
                             "--no-redis); this one had a Redis tier")
        placed = (sweep.get("placement") or {}).get("placed")
        if not placed or "item_tokens" not in sweep:
            raise RcllmError("the sweep lacks its placement or item token counts (a sweep "
                             "recorded before they were; run it again)")
        self.tokens: dict[str, int] = {str(k): int(v) for k, v in sweep["item_tokens"].items()}
        self.kv = int(kv_bytes_per_token)
        budget = store_budget(sweep)
        self.stores = [StoreSim(budget) for _ in placed]
        self.history = [StoreSim(int(sweep.get("history_bytes") or HISTORY_BYTES))
                        for _ in placed]
        for store, items in zip(self.stores, placed):
            for item in items:
                store.put(("item", str(item)), self.tokens.get(str(item), 0) * self.kv)
        # what the router counts each instance holding (`serve/views.LiveInstance.cached`):
        # what its store kept of the placement, then updated at each answer (`answered`)
        self.views = [set(st.items) for st in self.stores]

    def chunks(self, row: Mapping[str, Any], tag: str) -> list[tuple[tuple, int]]:
        """The request's chunks with their tokens: its candidates', then its history's."""
        out = [(("item", str(i)), self.tokens.get(str(i), 0)) for i in row.get("items") or ()]
        hist = list(row.get("history_items") or ())
        per = int(row.get("history_tokens") or 0) / max(1, len(hist))
        out += [(("hist", tag, str(row.get("user")), str(h)), per) for h in hist]
        return out

    def owner(self, item: str, here: int) -> int | None:
        """The first other instance the router believes holds `item`."""
        return next((k for k, v in enumerate(self.views) if k != here and item in v), None)

    def answered(self, dest: int, row: Mapping[str, Any]) -> None:
        """The router's picture of `dest` after its answer: what its store holds (the answer
        reports the items it lost) and the request's candidates (built behind the answer)."""
        self.views[dest] = set(self.stores[dest].items) | {str(i) for i in row.get("items") or ()}

    def import_for(self, row: Mapping[str, Any], dest: int) -> dict[int, list[tuple]]:
        """The items the router believes `dest` lacks and another instance holds, by owner
        (the first such): those the owner's store still holds (an export of an item it evicted
        sends nothing). Stored at `dest` by `store_import` once they arrive in time."""
        by_owner: dict[int, list[tuple]] = {}
        for key, tokens in self.chunks(row, "")[:len(row.get("items") or ())]:
            if key[1] in self.views[dest]:
                continue
            o = self.owner(key[1], dest)
            if o is not None and key in self.stores[o]:
                by_owner.setdefault(o, []).append((key, tokens))
        return by_owner

    def store_import(self, dest: int, moves: Mapping[int, list[tuple]]) -> int:
        """Stores the imported chunks at `dest`; returns how many."""
        for pairs in moves.values():
            for key, tokens in pairs:
                self.stores[dest].put(key, int(tokens * self.kv))
        return sum(len(p) for p in moves.values())

    def store_of(self, key: tuple, dest: int) -> StoreSim:
        return (self.stores if key[0] == "item" else self.history)[dest]

    def look_up(self, row: Mapping[str, Any], dest: int, tag: str) -> Look:
        """What `row` finds at `dest` (a hit is refreshed now; a miss is built behind)."""
        look = Look()
        for key, tokens in self.chunks(row, tag):
            store = self.store_of(key, dest)
            look.lookups += 1
            is_item = key[0] == "item"
            look.item_tokens += tokens if is_item else 0
            if key in store:
                store.touch(key)
                look.hits += 1
                look.item_hit_tokens += tokens if is_item else 0
                look.history_hit_tokens += 0 if is_item else tokens
            else:
                look.built.append((key, int(round(tokens)), int(tokens * self.kv)))
        return look

    def put_chunks(self, dest: int, built: list[tuple[tuple, int, int]]) -> None:
        """Chunks built behind an answer enter the store of `dest`."""
        for key, _tokens, nbytes in built:
            self.store_of(key, dest).put(key, nbytes)

    def warm(self, rows: list[Mapping[str, Any]], trace_requests: int) -> None:
        """The warm-up's requests, in the order answered, where they went: the trace as is,
        then each series' first requests dated a day earlier (the capacity probe's prefix
        requests look nothing up)."""
        for n, row in enumerate(rows):
            if row.get("status") != 200 or not row.get("lookups") or row.get("instance") is None:
                continue
            dest = int(row["instance"]) % len(self.stores)
            self.put_chunks(dest, self.look_up(row, dest,
                                               "warm" if n < trace_requests else "-1").built)
            self.answered(dest, row)


def store_budget(sweep: Mapping[str, Any]) -> int:
    """The instances' `reuse.store_bytes`, as the sweep's `--set` gave it or the default."""
    budget = ReuseConfig().store_bytes
    for item in (sweep.get("config") or {}).get("overrides") or ():
        key, _, value = str(item).partition("=")
        if key.strip() == "reuse.store_bytes":
            budget = int(float(value))
    return budget
