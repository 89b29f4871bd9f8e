"""Per request of a served sweep: how long its engine thread waited for a core (`run_wait_ms`
over `thread_cpu_ms`), grouped by what ran beside it — the other instance's engine, and a
chunk build on its own or the other instance's builder thread.

    python scripts/served_wait.py SWEEP.json FIT.json

SWEEP.json: `rcllm bench serve --sweep`'s sweep.json (recorded since `run_wait_ms` exists);
FIT.json: a `bench ttft --json` run with timed chunk builds (`rcllm sim sweep --fit-json`).
A request's engine span is `served.engine_spans`' (the one `served_overlap.py` reads); a
builder's busy spans are rebuilt from the answers' `behind_tokens`, one job after another from
the end of each engine call on, each priced by the
fit run's builds (`served.fit_behind`) — an estimate, since the sweep does not time builds.
Prints, per group, the number of requests and the median and mean wait / CPU, and the least
squares fit wait / CPU = a + b·(other engine's overlap) + c·(own builder's) + d·(other's).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from rcllm.sim import served


def rows(sweep: dict, cost: tuple[float, float]) -> np.ndarray:
    """[wait / CPU, other engine overlap, own builder overlap, other builder overlap] per
    answered request with its wait recorded."""
    out = []
    for c in sweep["cells"]:
        answered = [r for r in c["requests"]
                    if r["status"] == 200 and r.get("run_wait_ms") is not None]
        engine = served.engine_spans(answered)
        builds: dict[int, list] = {}
        free: dict[int, float] = {}
        # a build starts when its request's engine call is over (answer = start + total_ms)
        for (start, _, d), r in sorted(zip(engine, answered), key=lambda x: x[0][0]):
            work = sum(cost[0] + cost[1] * n for n, _ in r.get("behind_tokens", []))
            if work > 0:
                begin = max(start + r["total_ms"], free.get(d, 0.0))
                free[d] = begin + work
                builds.setdefault(d, []).append((begin, free[d]))
        for (s, e, d), r in zip(engine, answered):
            out.append((r["run_wait_ms"] / r["thread_cpu_ms"],
                        served.overlap((s, e), [(s2, e2) for s2, e2, d2 in engine if d2 != d]),
                        served.overlap((s, e), builds.get(d, [])),
                        served.overlap((s, e), [b for d2, bs in builds.items() if d2 != d
                                                for b in bs])))
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
