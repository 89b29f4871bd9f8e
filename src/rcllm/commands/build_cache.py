"""`rcllm build-cache`: precompute position-independent item (and review) KV into a store."""

from __future__ import annotations

import argparse
import json
import time

from ..errors import RcllmError
from ..records import Dataset, Item, ItemId
from .common import add_data_options, add_engine_options, engine_config, load_data


def register(top, bench) -> None:
    p = top.add_parser("build-cache", help="precompute item / review KV into --kv-dir",
                       formatter_class=argparse.RawTextHelpFormatter)
    add_engine_options(p)
    add_data_options(p, requests=10**9)
    p.add_argument("--catalog", metavar="FILE",
                   help="JSON-lines catalog: one {item_id, title, description, category} per line")
    p.add_argument("--history", action="store_true",
                   help="also precompute the KV of every review in --data")
    p.set_defaults(func=run)


def read_catalog(path: str) -> dict[ItemId, Item]:
    items: dict[ItemId, Item] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    item = Item(ItemId(str(rec["item_id"])), str(rec.get("title", "")),
                                str(rec.get("description", "")), str(rec.get("category", "")))
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise RcllmError(f"{path}:{lineno}: bad catalog line ({exc})") from None
                items[item.item_id] = item
    except OSError as exc:
        raise RcllmError(f"cannot read catalog {path}: {exc.strerror}") from None
    if not items:
        raise RcllmError(f"catalog {path} holds no items")
    return items


def run(args) -> int:
    if not args.kv_dir:
        raise RcllmError("--kv-dir is required: the KV must be stored somewhere that outlives "
                         "this command")
    cfg = engine_config(args)
    if args.catalog:
        ds = Dataset("catalog", read_catalog(args.catalog), {})
    else:
        ds = load_data(args)
    from ..kvstore.wiring import close_store
    from ..launch import make_stored_engine

    engine = make_stored_engine(cfg, ds.items, kv_dir=args.kv_dir)
    try:
        t = time.perf_counter()
        built = engine.build_items(ds.items, progress=True)
        secs = time.perf_counter() - t
        print(f"items: {built} built, {len(ds.items) - built} already cached, "
              f"{built / max(secs, 1e-9):.1f} items/s")
        if args.history:
            entries = [e for hist in ds.users.values() for e in hist]
            t = time.perf_counter()
            hb = engine.build_history(entries, progress=True)
            secs = time.perf_counter() - t
            print(f"reviews: {hb} built, {len(entries) - hb} already cached or duplicate, "
                  f"{hb / max(secs, 1e-9):.1f} reviews/s")
    finally:
        close_store(engine.store)  # drains write-behind to disk
    print(f"stored in {args.kv_dir}")
    return 0
