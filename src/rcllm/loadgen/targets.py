"""The served sweep's headline, read off its cells (issue 30's targets), and a sweep re-read at
another SLO (`rcllm bench serve --report SWEEP.json --slo-ms S`).

- **Where the baseline still meets the SLO**: the highest swept rate at which prefix answered
  every request (no 429, none lost) with its P99 TTFT within the SLO. There, each other method
  series' P99 is compared with prefix's (prefix P99 / its P99: > 1 is lower).
- **Goodput at the SLO**: a series' goodput is the most requests per second it answered within
  the SLO over the swept rates (below its capacity goodput follows the rate; above, it is what
  the series sustains); compared with prefix's the same way.
- **Routing**: at the two highest rates, the policy series' method's (rcllm 0.3/0.3 unless
  `--policy-method` named another) P99 under affinity (and under cost,
  where it ran) against hit-only and load-only (each P99 with its bootstrap 90% interval in the
  cells).
- **Locality** (issue 62): at the same two rates, affinity's and cost's item-token hit ratio
  against load-only's (target +0.10), and whether their P99 interval lies wholly below
  load-only's (the intervals apart).

Only the cells decide: nothing here measures, so a sweep stopped early (`sweep.partial.json`)
or read at another SLO gives the same verdict its requests support.
"""

from __future__ import annotations

import os

from ..config import METHOD_ALIASES
from ..errors import RcllmError, read_json_file
from ..routing.policies import Affinity, CostBased, HitOnly, LoadOnly
from ..routing.registry import in_role
from .cells import cell_metrics
from .peers import format_peer, meets, peer_headline

BASELINE = "prefix"
P99_TARGET = 1.5
GOODPUT_TARGET = 1.5
# the series that lose nothing against full: shown beside the fast paths, never judged
PEERS = ("full", BASELINE, *METHOD_ALIASES)
# the routing target: the cache-aware policies against the two that each miss one side
AFFINITY, COST, RIVALS = Affinity.name, CostBased.name, (HitOnly.name, LoadOnly.name)
HIT_GAIN_TARGET = 0.10      # item-token hits a cache-aware policy should win over load-only


def sweep_targets(cells: list[dict], slo_ms: float) -> dict:
    """The verdict of the module docstring for `cells` (their `goodput_rps` at `slo_ms`)."""
    own = {}                                    # method series on its own policy: rate → cell
    for c in cells:
        if in_role(c, "method"):
            own.setdefault(c["method"], {})[c["rate_rps"]] = c
    base = own.get(BASELINE, {})
    meeting = [r for r, c in base.items() if meets(c, slo_ms)]
    at = max(meeting) if meeting else None
    p99 = {}
    if at is not None:
        for name, by_rate in own.items():
            if name != BASELINE and at in by_rate:
                p99[name] = base[at]["ttft_p99_ms"] / by_rate[at]["ttft_p99_ms"]
    goodput = {name: max(c["goodput_rps"] for c in by_rate.values())
               for name, by_rate in own.items()}
    g0 = goodput.get(BASELINE, 0.0)
    # no baseline series in the sweep (e.g. a routing-only sweep): nothing to compare with
    ratio = {name: (g / g0 if g0 > 0 else (float("inf") if g > 0 else None))
             if BASELINE in goodput else None
             for name, g in goodput.items() if name != BASELINE}
    policies = []
    by_policy = {}
    for c in cells:
        if in_role(c, "policy"):
            by_policy.setdefault(c["rate_rps"], {})[c["policy"]] = c
    full_rates = sorted(r for r, ps in by_policy.items()
                        if {AFFINITY, *RIVALS} <= set(ps))
    for r in full_rates[-2:]:
        ps = by_policy[r]
        policies.append({"rate_rps": r,
                         "p99_ms": {p: c["ttft_p99_ms"] for p, c in ps.items()},
                         "p99_ci90": {p: c.get("ttft_p99_ci90") for p, c in ps.items()},
                         "affinity_lowest": _lowest(ps, AFFINITY),
                         "cost_lowest": _lowest(ps, COST)})
    return {"slo_ms": slo_ms, "baseline": BASELINE, "baseline_meets_slo_at_rps": at,
            "p99_lower_than_baseline": p99, "p99_target": P99_TARGET,
            "goodput_at_slo_rps": goodput, "goodput_vs_baseline": ratio,
            "goodput_target": GOODPUT_TARGET, "policies_at_top_rates": policies,
            "locality": locality(by_policy),
            # the headline at parity: every fast path against the stronger exact peer
            "vs_strongest_peer": peer_headline(own, slo_ms)}


def locality(by_policy: dict) -> list[dict]:
    """At the two highest rates where load-only and affinity or cost ran: each cache-aware
    policy's item-token hit gain over load-only and whether its P99's 90% interval lies wholly
    below load-only's (cells recorded before the hit ratio was kept say None)."""
    out = []
    rates = sorted(r for r, ps in by_policy.items()
                   if LoadOnly.name in ps and ({AFFINITY, COST} & set(ps)))
    for r in rates[-2:]:
        ps, base = by_policy[r], by_policy[r][LoadOnly.name]
        for p in (AFFINITY, COST):
            if p not in ps:
                continue
            c = ps[p]
            gain = (None if c.get("item_token_hit_ratio") is None
                    or base.get("item_token_hit_ratio") is None
                    else c["item_token_hit_ratio"] - base["item_token_hit_ratio"])
            ci, base_ci = c.get("ttft_p99_ci90"), base.get("ttft_p99_ci90")
            out.append({"rate_rps": r, "policy": p, "hit_gain": gain,
                        "hit_gain_met": None if gain is None else gain >= HIT_GAIN_TARGET,
                        "p99_ms": c["ttft_p99_ms"], "load_only_p99_ms": base["ttft_p99_ms"],
                        "p99_below_apart": (None if not ci or not base_ci
                                            else ci[1] < base_ci[0])})
    return out


def _lowest(ps: dict, policy: str) -> bool | None:
    """Whether `policy`'s P99 is below hit-only's and load-only's at one rate (None: the
    policy did not run there)."""
    if policy not in ps:
        return None
    return all(ps[policy]["ttft_p99_ms"] < ps[p]["ttft_p99_ms"] for p in RIVALS)


def format_targets(t: dict) -> str:
    """The verdict as lines for the terminal and sweep.md."""
    lines = [f"targets at SLO {t['slo_ms']:g} ms (baseline {t['baseline']}):"]
    if t["baseline_meets_slo_at_rps"] is None:
        lines.append(f"  {t['baseline']} meets the SLO (P99, every request answered) at no "
                     "swept rate: no P99 comparison; raise --slo-ms or add lower rates")
    else:
        lines.append(f"  highest rate where {t['baseline']} meets it: "
                     f"{t['baseline_meets_slo_at_rps']:.3f} rps; P99 x lower there:")
        for name, r in t["p99_lower_than_baseline"].items():
            lines.append(f"    {name}: {r:.2f}" + _verdict(name, r, t["p99_target"]))
    lines.append("  goodput at the SLO (best over the rates, rps) and x the baseline's:")
    for name, g in t["goodput_at_slo_rps"].items():
        r = t["goodput_vs_baseline"].get(name)
        ratio = "" if r is None else f" x{r:.2f}"
        lines.append(f"    {name}: {g:.3f}{ratio}" + _verdict(name, r, t["goodput_target"]))
    if "vs_strongest_peer" in t:
        lines += format_peer(t["vs_strongest_peer"])
    for p in t["policies_at_top_rates"]:
        vals = ", ".join(f"{k} {v:.0f}" for k, v in sorted(p["p99_ms"].items()))
        line = (f"  routing at {p['rate_rps']:.3f} rps, P99 ms: {vals}; {AFFINITY} lowest "
                f"of {'/'.join((AFFINITY, *RIVALS))}: "
                f"{'yes' if p['affinity_lowest'] else 'no'}")
        if p.get("cost_lowest") is not None:
            line += (f"; {COST} below {' and '.join(RIVALS)}: "
                     f"{'yes' if p['cost_lowest'] else 'no'}")
        lines.append(line)
    for x in t.get("locality") or ():
        gain = "n/a" if x["hit_gain"] is None else f"{x['hit_gain']:+.3f}"
        lines.append(f"  locality at {x['rate_rps']:.3f} rps, {x['policy']} against load-only: "
                     f"item-token hits {gain} (target +{HIT_GAIN_TARGET:g}: "
                     f"{'met' if x['hit_gain_met'] else 'missed'}); P99 {x['p99_ms']:.0f} "
                     f"vs {x['load_only_p99_ms']:.0f} ms, intervals apart below: "
                     f"{'yes' if x['p99_below_apart'] else 'no'}")
    return "\n".join(lines)


def _verdict(name: str, ratio: float | None, target: float) -> str:
    """The targets judge the fast paths; the exact peers — full, prefix (the baseline, and
    prefix under another policy: `prefix@load-only`) and exact-user (lossless) — are shown
    only."""
    if ratio is None or name.split("@")[0] in PEERS:
        return ""
    return f" ({'met' if ratio >= target else 'missed'}, target {target:g})"


def reread(path: str, slo_ms: float, out: str) -> dict:
    """A finished (`sweep.json`) or stopped (`sweep.partial.json`) sweep with every cell's
    SLO numbers recomputed from its requests at `slo_ms`, written to `out` (never over `path`)."""
    report = read_json_file(
        path, f"--report {path!r}: no such file (a sweep.json or sweep.partial.json)",
        f"--report {path!r}")
    if report.get("name", "bench.serve.sweep") != "bench.serve.sweep" or not report.get("cells"):
        raise RcllmError(f"--report {path!r} is not a sweep with cells (bench serve --sweep)")
    target = os.path.join(out, "sweep.json")
    if os.path.exists(target) and os.path.samefile(target, path):
        raise RcllmError(f"--out {out!r} holds the sweep being read; name another folder")
    cells = []
    for c in report["cells"]:
        if "requests" not in c:
            raise RcllmError(f"--report {path!r}: a cell has no per-request rows")
        cells.append({**c, **cell_metrics(c["requests"], c["wall_s"], slo_ms,
                                          report.get("prefix_instruction_tokens"),
                                          c.get("prewarm_requests"))})
    n = max(c["sent"] for c in cells)
    return {**report, "partial": report.get("partial", False), "slo_ms": slo_ms,
            "reread_from": path, "cells": cells,
            "trace": report.get("trace", {"requests": n}),
            "capacity_rps": report.get("capacity_rps"),
            "wall_s": report.get("wall_s", sum(c["wall_s"] for c in cells))}
