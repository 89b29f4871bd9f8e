"""The map's read-outs (`sim/map.py`): per cell the gain of cache-aware routing over load-only at
the same rate, METIS against random, the paper's band, the headline, the markdown and the one
PNG (a heat map of the gain over instances × budget, one panel per path and user side)."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from ..report import markdown_table
from ..routing.registry import REGISTRY

GAIN = 1.3            # the bar: P99 at least 1.3x lower than load-only's
METIS_EDGE = 0.05     # METIS beats random by this much item hit ratio
BAND = (1.4, 2.8)     # RcLLM's simulated P99 speed-up over Prefix-Cache at 40 instances
CELL = ("tail", "instances", "placement", "budget", "path", "user_side")


def cache_aware(policy: str) -> bool:
    return REGISTRY[policy].reads == "items"


def gains(rows: list[dict]) -> list[dict]:
    """Per cell: load-only's P99 and hits, the best cache-aware policy's, and the gain
    (load-only P99 / its P99; < 1: cache-aware routing loses)."""
    cells: dict[tuple, dict] = defaultdict(dict)
    for r in rows:
        cells[tuple(r[c] for c in CELL)][r["policy"]] = r
    out = []
    for key, pol in cells.items():
        lo = pol["load-only"]
        aware = [r for p, r in pol.items() if cache_aware(p)]
        if not aware:
            continue
        best = min(aware, key=lambda r: r["p99_ms"])
        out.append({**dict(zip(CELL, key)), "rate_rps": lo["rate_rps"],
                    "load_only_p99_ms": lo["p99_ms"], "load_only_hit": lo["item_hit"],
                    "best": best["policy"], "best_p99_ms": best["p99_ms"],
                    "best_hit": best["item_hit"], "gain": lo["p99_ms"] / best["p99_ms"],
                    "goodput_gain": best["goodput_rps"] / max(lo["goodput_rps"], 1e-9)})
    return out


def metis_edges(rows: list[dict]) -> list[dict]:
    """Per cell and cache-aware policy: METIS's item hit ratio minus random's."""
    hit = {tuple(r[c] for c in CELL) + (r["policy"],): r["item_hit"] for r in rows}
    out = []
    for key, h in hit.items():
        tail, k, placement, b, path, side, pol = key
        other = hit.get((tail, k, "random", b, path, side, pol))
        if placement == "metis" and other is not None and cache_aware(pol):
            out.append({"tail": tail, "instances": k, "budget": b, "path": path,
                        "user_side": side, "policy": pol, "metis_minus_random": h - other})
    return out


def headline(rows: list[dict], band: list[dict]) -> dict:
    """The smallest cluster where cache-aware routing's P99 is >= GAIN x lower than load-only's,
    where it loses (gain < 1), where METIS beats random by METIS_EDGE, and the band."""
    g, edges = gains(rows), metis_edges(rows)
    wins = [c for c in g if c["gain"] >= GAIN]
    best_band = {}
    for r in band:
        key = (r["tail"], r["budget"], r["path"], r["user_side"])
        if cache_aware(r["policy"]) and r["p99_speedup"] > best_band.get(key, 0.0):
            best_band[key] = r["p99_speedup"]
    speedups = list(best_band.values())
    first = min(wins, key=lambda c: (c["instances"], -c["gain"]), default=None)
    return {"gain_bar": GAIN, "cells": len(g),
            "smallest_instances_with_gain": first and first["instances"],
            "first_gain_cell": first and {k: first[k] for k in (*CELL, "best", "gain")},
            "cells_with_gain": len(wins), "cells_where_cache_aware_loses": sum(
                c["gain"] < 1.0 for c in g),
            "metis_edge": METIS_EDGE,
            "metis_cells_ahead": sum(e["metis_minus_random"] >= METIS_EDGE for e in edges),
            "metis_cells": len(edges),
            "metis_ahead_at": sorted({(e["instances"], e["budget"]) for e in edges
                                      if e["metis_minus_random"] >= METIS_EDGE},
                                     key=lambda x: (x[0], Fraction(x[1]))),
            "band": list(BAND), "band_p99_speedup_range": ([min(speedups), max(speedups)]
                                                           if speedups else None),
            "band_cells_inside": sum(BAND[0] <= s <= BAND[1] for s in speedups),
            "band_cells": len(speedups)}


def markdown(result: dict, head: dict) -> str:
    """The headline, the gain grid per tail (rows: path, user side, instances; columns:
    budgets), the band and every row."""
    g = gains(result["rows"])
    lines = ["# The map (`rcllm sim map`)", "", "```", *(f"{k}: {v}" for k, v in head.items()),
             "```", ""]
    budgets = sorted({c["budget"] for c in g}, key=Fraction, reverse=True)
    for tail in dict.fromkeys(c["tail"] for c in g):
        lines += [f"## {tail} (alpha {result['alphas'][tail]:.2f}): load-only P99 / best "
                  "cache-aware P99 (item hits load-only -> it), METIS", ""]
        grid: dict[tuple, dict] = defaultdict(dict)
        for c in g:
            if c["tail"] == tail and c["placement"] == "metis":
                grid[(c["path"], c["user_side"], c["instances"])][c["budget"]] = (
                    f"{c['gain']:.2f}x ({c['load_only_hit']:.2f}->{c['best_hit']:.2f})")
        table = [{"path": p, "user side": s, "instances": k, **cols}
                 for (p, s, k), cols in grid.items()]
        lines += [markdown_table(table, ["path", "user side", "instances", *budgets]), ""]
    if result["band"]:
        lines += ["## The band: Prefix-Cache P99 / rcllm P99 at the same rate", "",
                  markdown_table(result["band"], ["tail", "instances", "budget", "path",
                                                  "user_side", "policy", "rate_rps",
                                                  "prefix_p99_ms", "rcllm_p99_ms", "item_hit",
                                                  "p99_speedup"]), ""]
    cols = [*CELL, "policy", "rate_rps", "p50_ms", "p99_ms", "item_hit", "goodput_rps",
            "slo_met", "turnover"]
    return "\n".join(lines + ["## Every cell", "", markdown_table(result["rows"], cols), ""])


def plot(result: dict, path: str) -> None:
    """One PNG: per tail × user side (rows) and path (columns), the gain over instances ×
    budget (METIS placement), red where cache-aware routing loses, blue where it wins; cells
    at or above GAIN are boxed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    g = [c for c in gains(result["rows"]) if c["placement"] == "metis"]
    panels = sorted({(c["tail"], c["user_side"]) for c in g}, key=str)
    paths = list(dict.fromkeys(c["path"] for c in g))
    ks = sorted({c["instances"] for c in g})
    budgets = sorted({c["budget"] for c in g}, key=Fraction, reverse=True)
    fig, axes = plt.subplots(len(panels), len(paths), squeeze=False, layout="constrained",
                             figsize=(3.4 * len(paths) + 1, 2.6 * len(panels) + 0.6))
    for (row, (tail, side)), (col, p) in ((r, c) for r in enumerate(panels)
                                          for c in enumerate(paths)):
        ax, z = axes[row][col], np.full((len(ks), len(budgets)), np.nan)
        for c in g:
            if (c["tail"], c["user_side"], c["path"]) == (tail, side, p):
                z[ks.index(c["instances"]), budgets.index(c["budget"])] = c["gain"]
        im = ax.imshow(np.log2(z), cmap="RdBu", vmin=-1, vmax=1, origin="lower",
                       aspect="auto")
        for (i, j), v in np.ndenumerate(z):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        fontweight="bold" if v >= GAIN else "normal")
                if v >= GAIN:
                    ax.add_patch(plt.Rectangle((j - .5, i - .5), 1, 1, fill=False, lw=1.5))
        ax.set_xticks(range(len(budgets)), budgets, fontsize=7)
        ax.set_yticks(range(len(ks)), ks, fontsize=7)
        ax.set_title(f"{p}, user side {side} ({tail})", fontsize=8)
        ax.set_xlabel("item budget per instance", fontsize=7)
        ax.set_ylabel("instances", fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.6, label="log2 of the gain")
    fig.suptitle(f"P99 of load-only / P99 of the best cache-aware policy, same rate, METIS\n"
                 f"(boxed: >= {GAIN}x; red: cache-aware routing loses)", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, config: dict, out: str) -> list[str]:
    """`map.json` (the reporting contract: rows per cell and policy; summary: the headline,
    each cell's gain, METIS against random, the band), `map.md` and `map.png` under `out`."""
    import os

    from ..report import write_report

    head = headline(result["rows"], result["band"])
    paths = [os.path.join(out, f"map.{ext}") for ext in ("json", "md", "png")]
    write_report(paths[0], "sim.map", {**config, "alphas": result["alphas"]}, result["rows"],
                 {"headline": head, "gains": gains(result["rows"]),
                  "metis_vs_random": metis_edges(result["rows"]), "band": result["band"]})
    with open(paths[1], "w", encoding="utf-8") as fh:
        fh.write(markdown(result, head))
    plot(result, paths[2])
    return paths
