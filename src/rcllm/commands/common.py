"""Options and set-up shared by the engine commands (demo, bench, eval, rank, build-cache)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Sequence

from ..config import RcllmConfig, describe, load
from ..errors import RcllmError
from ..launch import DEFAULT_SYNTHETIC, engine_config, load_data  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)



def add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file of options (see --set)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one option, e.g. --set reuse.item_ratio=0.3 (repeatable); "
                        "options and defaults:\n" + "\n".join(describe(RcllmConfig)))
    p.add_argument("--kv-dir", metavar="DIR",
                   help="persistent chunk KV store (as written by `rcllm build-cache`); "
                        "default: process memory only")


def add_data_options(p: argparse.ArgumentParser, requests: int) -> None:
    p.add_argument("--data", metavar="PATH",
                   help="dataset path (default: the built-in synthetic workload)")
    p.add_argument("--format", default="amazon2018",
                   help="dataset format: amazon2018, amazon2023, yelp, goodreads, movielens, "
                        "synthetic (default amazon2018)")
    p.add_argument("--category", help="category name when --data is an Amazon folder "
                                      "(default: the first found)")
    p.add_argument("--requests", type=int, default=requests,
                   help=f"number of requests (leave-last-out users; default {requests})")
    p.add_argument("--candidates", type=int, default=20, help="candidates per request (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of sampling (default 0)")


def add_candidate_source_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--candidate-source", choices=("popularity", "retrieval"), default="popularity",
                   help="candidates: the target + popularity-sampled negatives (default) or the "
                        "item-kNN retriever's shortlist with the target kept (see "
                        "rcllm.eval.protocol; the retriever's recall is reported)")


def print_retrieval_recall(recall: float | None) -> None:
    """With retrieved candidates, how often the retriever's shortlist held the target."""
    if recall is not None:
        print(f"retrieved candidates: the retriever shortlisted the target in {recall:.1%} of "
              f"these requests (kept in the others)")


def load_workload(args, users=None):
    """Returns (dataset, cases) for --data/--format or the built-in synthetic workload.

    `users`: None for every user, or a function dataset -> the user ids to keep (e.g. the
    test part of a split); a user's case does not depend on which others are kept."""
    from ..eval.protocol import build_cases

    if args.requests < 1:
        raise RcllmError("--requests must be >= 1")
    if not 2 <= args.candidates <= 26:
        raise RcllmError("--candidates must be within 2..26")
    ds = load_data(args)
    keep = set(users(ds)) if users else None
    cases = build_cases(ds, history_window=10, num_negatives=args.candidates - 1, seed=args.seed,
                        max_cases=None if keep is not None else args.requests,
                        candidate_source=getattr(args, "candidate_source", "popularity"))
    if keep is not None:
        cases = [c for c in cases if c.user_id in keep][: args.requests]
    if not cases:
        raise RcllmError(f"no request could be built from {args.data or 'the synthetic data'}")
    return ds, cases


def make_engine(args, ds, scorer: str = "verbalizer", cfg: RcllmConfig | None = None):
    """The engine over the dataset's catalog; `--kv-dir` adds a checked disk tier (the same
    store `rank` and `serve` use, so their entries are interchangeable)."""
    from ..launch import make_stored_engine

    cfg = cfg or engine_config(args)
    return make_stored_engine(cfg, ds.items, scorer, getattr(args, "kv_dir", None))


@dataclass(frozen=True)
class Variant:
    """One row of a method comparison: a method and its recompute budgets."""

    method: str
    item_ratio: float = 0.0
    history_ratio: float = 0.0
    # pointwise scorer: the user side from the user-prefix cache (warmed for the request
    # before it is timed) instead of built from reused history chunks
    user_prefix: bool = field(default=False, kw_only=True)
    late_layer: int | None = field(default=None, kw_only=True)  # late@s; None: the config's

    @property
    def label(self) -> str:
        if self.method == "exact-user":  # its user side is the cached one by definition
            return self.method
        if self.method == "late" and self.late_layer is not None:
            name = f"late@{self.late_layer}"
        elif self.method in ("rcllm",):
            name = f"rcllm {self.item_ratio:g}/{self.history_ratio:g}"
        elif self.method == "cacheblend":
            name = f"cacheblend {self.item_ratio:g}"
        else:
            name = self.method
        return name + (" +user prefix" if self.user_prefix else "")

    def overrides(self) -> dict:
        out = {"user_prefix": self.user_prefix}
        if self.method in ("rcllm", "cacheblend"):
            out.update(item_ratio=self.item_ratio, history_ratio=self.history_ratio)
        if self.method == "late" and self.late_layer is not None:
            out["late_layer"] = self.late_layer
        return out


def parse_methods(text: str, item_ratio: float, history_ratio: float) -> list[Variant]:
    from ..config import METHODS

    out = []
    for name in [m.strip() for m in text.split(",") if m.strip()]:
        layer = None
        if name.startswith("late@"):  # late@s: the late method at layer s
            name, _, s = name.partition("@")
            if not s.isdigit():
                raise RcllmError(f"late@S needs a layer number S, got 'late@{s}'")
            layer = int(s)
        if name not in METHODS:
            raise RcllmError(f"unknown method {name!r}; use {', '.join(METHODS)} (late@S: the "
                             "late method at layer S)")
        out.append(Variant(name, item_ratio, history_ratio, late_layer=layer,
                           user_prefix=name == "exact-user"))
    if not out or out[0].method != "full":
        out.insert(0, Variant("full"))
    return out


def default_variants(extra_budgets: Sequence[tuple[float, float]] = ((0.3, 0.3), (0.15, 0.15))):
    rows = [Variant("full"), Variant("prefix"), Variant("naive"), Variant("epic"),
            Variant("cacheblend", 0.15, 0.15), Variant("cacheblend", 0.3, 0.3)]
    rows += [Variant("rcllm", i, h) for i, h in extra_budgets]
    return rows


def pointwise_variants(extra_budgets: Sequence[tuple[float, float]] = ((0.3, 0.3), (0.15, 0.15))):
    """The listwise rows (user side built from reused history chunks: a user-prefix miss),
    late (items joined with the user at reuse.late_layer: an adapter's validated fast path),
    `exact-user` (the lossless peer of a cached user side: every candidate token computed),
    and the reuse methods again with the user side cached (a user-prefix hit)."""
    rows = default_variants(extra_budgets) + [Variant("late")]
    rows += [Variant("exact-user", user_prefix=True)]
    rows += [Variant("naive", user_prefix=True), Variant("late", user_prefix=True)]
    rows += [Variant("rcllm", i, h, user_prefix=True) for i, h in extra_budgets]
    return rows


def positive_ints(text: str, what: str) -> list[int]:
    """A comma-separated list of positive integers given as option `what`."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RcllmError(f"{what} must be comma-separated integers, not {text!r}") from None
    if not out or min(out) < 1:
        raise RcllmError(f"{what} must list positive integers")
    return out
