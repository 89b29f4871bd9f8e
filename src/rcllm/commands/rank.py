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
from .common import add_data_options, add_engine_options, engine_config, load_data, make_engine

OVERRIDES = ("item_ratio", "history_ratio")


def register(top, bench) -> None:
    p = top.add_parser("rank", help="rank one request (JSON) and print the ranking",
                       formatter_class=argparse.RawTextHelpFormatter)
    add_engine_options(p)
    add_data_options(p, requests=1)
    p.add_argument("--request", required=True, metavar="FILE", help="request JSON (see docs)")
    p.add_argument("--scorer", choices=("verbalizer", "likelihood", "pointwise"),
                   default="verbalizer",
                   help="verbalizer (listwise labels), likelihood (titles) or pointwise (yes/no "
                        "log-odds per candidate)")
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


def run(args) -> int:
    req, method, overrides = parse_request(args.request)
    cfg = engine_config(args)
    ds = load_data(args)
    engine = make_engine(args, ds, scorer=args.scorer, cfg=cfg)
    res = engine.rank(req, method, **overrides)
    print(f"method {res.method}: TTFT {res.ttft_ms:.0f} ms, {res.stats['tokens']} tokens, "
          f"{res.stats['recomputed_fraction']:.0%} recomputed, chunk hits "
          f"{res.stats['chunk_hits']}, misses {res.stats['chunk_misses']}")
    for pos, item_id in enumerate(res.ranking, 1):
        print(f"{pos:2d}. {item_id}  {res.scores[item_id]:+.3f}  {ds.items[item_id].title[:70]}")
    return 0
