"""Per request of a served sweep: how long its engine thread waited for a core (`run_wait_ms`
over `thread_cpu_ms`), grouped by what ran beside it — the other instance's engine, and a
chunk build on its own or the other instance's builder thread.

    python scripts/served_wait.py SWEEP.json FIT.json

SWEEP.json: `rcllm bench serve --sweep`'s sweep.json (recorded since `run_wait_ms` exists);
FIT.json: a `bench ttft --json` run with timed chunk builds (`rcllm sim sweep --fit-json`).
A request's engine span is [answer − ttft_ms, answer]; a builder's busy spans are rebuilt from
the answers' `behind_tokens`, one job after another from each answer on, each priced by the
fit run's builds (`served.fit_behind`) — an estimate, since the sweep does not time builds.
Prints, per group, the number of requests and the median and mean wait / CPU, and the least
squares fit wait / CPU = a + b·(other engine's overlap) + c·(own builder's) + d·(other's).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from rcllm.sim import served


def overlap(span: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    s, e = span
    return min(1.0, sum(max(0.0, min(e, e2) - max(s, s2)) for s2, e2 in spans) / (e - s))


def rows(sweep: dict, cost: tuple[float, float]) -> np.ndarray:
    """[wait / CPU, other engine overlap, own builder overlap, other builder overlap] per
    answered request with its wait recorded."""
    out = []
    for c in sweep["cells"]:
        answered = [(a * 1e3 + r["latency_ms"], r) for a, r in zip(c["arrivals_s"], c["requests"])
                    if r["status"] == 200 and r.get("run_wait_ms") is not None]
        engine = [((end - r["ttft_ms"], end), int(r["instance"])) for end, r in answered]
        builds: dict[int, list] = {}
        free: dict[int, float] = {}
        for end, r in sorted(answered, key=lambda x: x[0]):
            work = sum(cost[0] + cost[1] * n for n, _ in r.get("behind_tokens", []))
            if work > 0:
                d = int(r["instance"])
                start = max(end, free.get(d, end))
                free[d] = start + work
                builds.setdefault(d, []).append((start, free[d]))
        for (span, d), (_, r) in zip(engine, answered):
            out.append((r["run_wait_ms"] / r["thread_cpu_ms"],
                        overlap(span, [s for s, d2 in engine if d2 != d]),
                        overlap(span, builds.get(d, [])),
                        overlap(span, [s for d2, b in builds.items() if d2 != d for s in b])))
    return np.array(out).reshape(-1, 4)


def main(sweep_path: str, fit_path: str) -> None:
    with open(sweep_path, encoding="utf-8") as fh:
        sweep = json.load(fh)
    cost = served.fit_behind(served.load_fit_extras([fit_path])[0])
    if cost is None:
        sys.exit(f"{fit_path} has no timed chunk builds")
    r = rows(sweep, cost)
    if not len(r):
        sys.exit(f"{sweep_path} records no run_wait_ms (a sweep from before it existed)")
    groups = [("other engine idle (< 30%)", r[:, 1] < 0.3),
              ("other busy > 90%, no build", (r[:, 1] > 0.9) & (r[:, 2] < 0.05) & (r[:, 3] < 0.05)),
              ("other busy > 90%, own build > 50%", (r[:, 1] > 0.9) & (r[:, 2] > 0.5)),
              ("other busy > 90%, other's build > 50%",
               (r[:, 1] > 0.9) & (r[:, 3] > 0.5) & (r[:, 2] < 0.05)),
              ("no build beside", (r[:, 2] < 0.05) & (r[:, 3] < 0.05))]
    print(f"{len(r)} requests")
    for name, mask in groups:
        if mask.any():
            print(f"  {name:40s} n={mask.sum():4d}  wait/CPU median {np.median(r[mask, 0]):.3f}"
                  f"  mean {r[mask, 0].mean():.3f}")
    x = np.c_[np.ones(len(r)), r[:, 1:]]
    coef = np.linalg.lstsq(x, r[:, 0], rcond=None)[0]
    print("  wait/CPU = %.3f + %.3f other engine + %.3f own build + %.3f other's build" % tuple(coef))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
