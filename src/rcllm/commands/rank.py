"""`rcllm rank`: rank one request given as JSON, against a dataset's catalog.

Request file: {"user_id": str, "history": [{"item_id", "rating", "review", "timestamp"}, ...],
"candidates": [item ids], "method": optional, "item_ratio": optional, "history_ratio": optional}.
"""

from __future__ import annotations

import argparse
import json

from ..errors import RcllmError
from ..prompt.builder import RankRequest
from ..records import HistoryEntry, ItemId
from .common import add_data_options, add_engine_options, engine_config, load_data

OVERRIDES = ("item_ratio", "history_ratio")


def register(top, bench) -> None:
    p = top.add_parser("rank", help="rank one request (JSON) and print the ranking",
                       formatter_class=argparse.RawTextHelpFormatter)
    add_engine_options(p)
    for action in p._actions:      # rank keeps a persistent store by default (see run)
        if action.dest == "kv_dir":
            action.help = ("persistent chunk KV store. Default: `kv` in the cache folder, i.e.\n"
                           "model.cache_dir/kv when set, else $RCLLM_CACHE/kv, else\n"
                           "~/.cache/rcllm/kv. A later `rank` reuses the item and review KV an\n"
                           "earlier one built. Clear it with `rm -r ~/.cache/rcllm/kv` (that\n"
                           "folder holds nothing else)")
    p.add_argument("--no-kv-dir", action="store_true",
                   help="keep chunk KV in process memory only (every run starts cold)")
    add_data_options(p, requests=1)
    p.add_argument("--request", required=True, metavar="FILE", help="request JSON (see docs)")
    p.add_argument("--scorer", choices=("verbalizer", "likelihood", "pointwise"),
                   help="verbalizer (listwise labels), likelihood (titles) or pointwise (yes/no "
                        "log-odds per candidate); default: the adapter's, else verbalizer")
    p.add_argument("--adapter", metavar="PATH",
                   help="LoRA adapter from `rcllm finetune`: sets model.adapter and adopts its "
                        "prompt settings, scorer and default method")
    p.set_defaults(func=run)


def parse_request(path: str) -> tuple[RankRequest, str | None, dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise RcllmError(f"cannot read request {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise RcllmError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise RcllmError(f"{path}: the request must be a JSON object")
    try:
        history = tuple(HistoryEntry(ItemId(str(h["item_id"])), float(h.get("rating", 0)),
                                     str(h.get("review", "")), int(h.get("timestamp", 0)))
                        for h in raw.get("history", []))
        history = tuple(sorted(history, key=lambda h: h.timestamp))
        req = RankRequest(str(raw["user_id"]), history,
                          tuple(ItemId(str(c)) for c in raw["candidates"]))
    except KeyError as exc:
        raise RcllmError(f"{path}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise RcllmError(f"{path}: bad value ({exc})") from None
    overrides = {k: float(raw[k]) for k in OVERRIDES if k in raw}
    return req, raw.get("method"), overrides


def kv_dir_of(args, cfg) -> str | None:
    """--kv-dir, else the cache folder's `kv` (None with --no-kv-dir)."""
    if getattr(args, "no_kv_dir", False):
        if args.kv_dir:
            raise RcllmError("--kv-dir and --no-kv-dir contradict each other")
        return None
    from ..kvstore.wiring import default_kv_dir
    from ..model.loading import cache_root

    return args.kv_dir or str(default_kv_dir(cache_root(cfg.model)))


def run(args) -> int:
    from ..kvstore.wiring import close_store, tiers
    from ..launch import adopt_adapter, chosen_options, make_stored_engine

    req, method, overrides = parse_request(args.request)
    adopted = adopt_adapter(engine_config(args), args.adapter, args.scorer,
                            chosen_options(args.config, args.overrides))
    ds = load_data(args)
    kv_dir = kv_dir_of(args, adopted.cfg)
    engine = make_stored_engine(adopted.cfg, ds.items, adopted.scorer, kv_dir)
    try:
        res = engine.rank(req, method, **overrides)
    finally:
        close_store(engine.store)      # writes this run's new chunks to disk before exiting
    print(f"method {res.method}: TTFT {res.ttft_ms:.0f} ms, {res.stats['tokens']} tokens, "
          f"{res.stats['recomputed_fraction']:.0%} recomputed at layer 1 "
          f"({res.stats['mean_recomputed_fraction']:.0%} over all layers), chunk hits "
          f"{res.stats['chunk_hits']}, misses {res.stats['chunk_misses']}")
    if kv_dir:
        disk = [t for t in tiers(engine.store) if hasattr(t, "slot")]
        corrupt = sum(t.corrupt for t in disk)
        print(f"chunk store {kv_dir}" + (f" ({corrupt} corrupt entries dropped and recomputed)"
                                         if corrupt else ""))
    for pos, item_id in enumerate(res.ranking, 1):
        print(f"{pos:2d}. {item_id}  {res.scores[item_id]:+.3f}  {ds.items[item_id].title[:70]}")
    if engine.untuned:
        from ..engine import UNTUNED_NOTE

        print(f"note: {UNTUNED_NOTE}")
    return 0
