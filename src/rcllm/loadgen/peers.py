"""The served headline against the strongest exact peer (issue 60 item 5; ../shared/docs/DESIGN.md,
"Measure against the strongest exact peer").

The exact peers lose nothing against full: `prefix` (prefix caching, routed prefix-aware as
deployed) and `exact-user` (the user side reused exactly, every candidate computed; with a relay
in front, the lossless peer). The stronger of the two is the one that meets the SLO (P99 within
it, every request answered) at the highest swept rate, the lower P99 there breaking a tie. At that
rate each fast-path series is compared with it:
- P99 ratio (peer P99 / the path's: > 1 is lower) with a 90% bootstrap interval (each cell's
  answered latencies resampled on their own);
- goodput ratio (requests answered within the SLO per second of the cell's wall time, the path's
  over the peer's) with a 90% bootstrap interval (each cell's rows resampled);
- the NDCG@10 of what each served (`cells.served_quality`) and the path's paired Δ against the
  peer's (both cells serve one trace, request i in both; rows answered in both), 90% interval.
Targets: P99 >= 2x lower and goodput >= 1.5x. Only the cells decide: nothing here measures.
"""

from __future__ import annotations

import numpy as np

from ..config import METHOD_ALIASES
from .cells import mean_interval, percentile_interval, served_gain

PEER_NAMES = ("prefix", *METHOD_ALIASES)
P99_TARGET = 2.0
GOODPUT_TARGET = 1.5
DRAWS = 1000


def _ok(cell: dict) -> list[dict]:
    return [r for r in cell.get("requests", []) if r["status"] == 200]


def meets(cell: dict, slo_ms: float) -> bool:
    return (cell["ok"] > 0 and cell["rejected_429"] == 0 and cell["lost"] == 0
            and cell["errors_5xx"] == 0 and cell["ttft_p99_ms"] <= slo_ms)


def strongest_peer(own: dict[str, dict[float, dict]], slo_ms: float
                   ) -> tuple[str, float] | None:
    """(peer, rate): the exact peer meeting the SLO at the highest swept rate (module
    docstring); None when no peer meets it at any rate."""
    best = None
    for name in PEER_NAMES:
        rates = [r for r, c in own.get(name, {}).items() if meets(c, slo_ms)]
        if not rates:
            continue
        at = max(rates)
        key = (at, -own[name][at]["ttft_p99_ms"])
        if best is None or key > best[0]:
            best = (key, name, at)
    return None if best is None else (best[1], best[2])


def p99_ratio(peer: dict, path: dict, seed: int = 0) -> tuple[float, list[float]]:
    """Peer P99 / path P99 and its 90% bootstrap interval."""
    a = np.array([r["latency_ms"] for r in _ok(peer)])
    b = np.array([r["latency_ms"] for r in _ok(path)])
    if not len(a) or not len(b):      # cells without their rows: the point only
        return peer["ttft_p99_ms"] / path["ttft_p99_ms"], [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    pa = np.percentile(a[rng.integers(0, len(a), (DRAWS, len(a)))], 99, axis=1)
    pb = np.percentile(b[rng.integers(0, len(b), (DRAWS, len(b)))], 99, axis=1)
    return float(np.percentile(a, 99) / np.percentile(b, 99)), percentile_interval(pa / pb)


def _within(cell: dict, slo_ms: float) -> np.ndarray:
    return np.array([r["status"] == 200 and r["latency_ms"] <= slo_ms
                     for r in cell["requests"]], dtype=float)


def goodput_ratio(peer: dict, path: dict, slo_ms: float, seed: int = 0
                  ) -> tuple[float | None, list[float] | None]:
    """The path's goodput over the peer's at one rate, and its 90% bootstrap interval."""
    if "requests" not in peer or "requests" not in path:
        return None, None
    a, b = _within(peer, slo_ms), _within(path, slo_ms)
    if a.sum() == 0 or not len(b):
        return None, None
    rng = np.random.default_rng(seed)
    ga = a[rng.integers(0, len(a), (DRAWS, len(a)))].sum(axis=1) / peer["wall_s"]
    gb = b[rng.integers(0, len(b), (DRAWS, len(b)))].sum(axis=1) / path["wall_s"]
    point = (b.sum() / path["wall_s"]) / (a.sum() / peer["wall_s"])
    return float(point), percentile_interval(gb / np.maximum(ga, 1e-12))


def paired_ndcg(peer: dict, path: dict, seed: int = 0) -> dict:
    """The path's served NDCG@10 minus the peer's, request by request (rows answered in both,
    with their top ten and target), and its 90% bootstrap interval."""
    pairs = [(served_gain(p["top10"], p["target"]), served_gain(q["top10"], q["target"]))
             for p, q in zip(peer.get("requests", []), path.get("requests", []))
             if p["status"] == 200 and q["status"] == 200 and p.get("target") is not None
             and "top10" in p and "top10" in q]
    if not pairs:
        return {"ndcg10_delta": None, "ndcg10_delta_ci90": None, "paired_n": 0}
    d = np.array([q - p for p, q in pairs])
    return {"ndcg10_delta": float(d.mean()), "ndcg10_delta_ci90": mean_interval(d, seed=seed),
            "paired_n": len(d)}


def peer_headline(own: dict[str, dict[float, dict]], slo_ms: float) -> dict:
    """Every fast-path series against the strongest exact peer (module docstring); `own`:
    method series on their own policy, name → rate → cell."""
    pick = strongest_peer(own, slo_ms)
    if pick is None:
        return {"peer": None, "rate_rps": None, "paths": {}}
    peer, at = pick
    paths = {}
    for name, by_rate in own.items():
        if name.split("@")[0] in (*PEER_NAMES, "full") or at not in by_rate:
            continue
        cell, base = by_rate[at], own[peer][at]
        ratio, ci = p99_ratio(base, cell)
        good, good_ci = goodput_ratio(base, cell, slo_ms)
        paths[name] = {"p99_ratio": ratio, "p99_ratio_ci90": ci,
                       "goodput_ratio": good, "goodput_ratio_ci90": good_ci,
                       "served_ndcg10": cell.get("served_ndcg10"),
                       "peer_served_ndcg10": base.get("served_ndcg10"),
                       **paired_ndcg(base, cell)}
    return {"peer": peer, "rate_rps": at, "p99_target": P99_TARGET,
            "goodput_target": GOODPUT_TARGET, "paths": paths}


def format_peer(h: dict) -> list[str]:
    """The headline as lines for the terminal and sweep.md."""
    if h.get("peer") is None:
        return ["  no exact peer (prefix, exact-user) meets the SLO at any swept rate: no "
                "headline at parity"]
    lines = [f"  against the strongest exact peer, {h['peer']}, at {h['rate_rps']:.3f} rps "
             "(the highest rate where a peer meets the SLO):"]
    for name, p in h["paths"].items():
        good = ("-" if p["goodput_ratio"] is None else
                f"x{p['goodput_ratio']:.2f} [{p['goodput_ratio_ci90'][0]:.2f}, "
                f"{p['goodput_ratio_ci90'][1]:.2f}]")
        nd = ("" if p["ndcg10_delta"] is None else
              f"; served NDCG@10 {p['served_ndcg10']:.3f} vs {p['peer_served_ndcg10']:.3f}, "
              f"paired delta {p['ndcg10_delta']:+.3f} [{p['ndcg10_delta_ci90'][0]:+.3f}, "
              f"{p['ndcg10_delta_ci90'][1]:+.3f}]")
        lines.append(f"    {name}: P99 x{p['p99_ratio']:.2f} lower [{p['p99_ratio_ci90'][0]:.2f}, "
                     f"{p['p99_ratio_ci90'][1]:.2f}] (target {h['p99_target']:g}), goodput "
                     f"{good} (target {h['goodput_target']:g}){nd}")
    return lines
