"""Per request of a served sweep: engine TTFT, engine-thread CPU and look-up time against the
fitted profile's prediction, by how much of it the other instances' engines were computing.

    python scripts/served_overlap.py SWEEP.json FIT.json

SWEEP.json: `rcllm bench serve --sweep`'s sweep.json; FIT.json: the `bench ttft --json` run the
simulator is fitted on (`rcllm sim sweep --fit-json`). Prints one row per (series, band):
idle (< 20% overlap), mid, busy (> 80%), with medians of engine / predicted, CPU / predicted,
CPU / engine wall (below 1: time spent waiting for a core), assemble_ms and prefill_ms. CPU
columns are blank for sweeps recorded before `thread_cpu_ms` existed.
"""

from __future__ import annotations

import sys
import warnings
from collections import defaultdict

import numpy as np

from rcllm.routing.validate import load_bench_requests
from rcllm.sim import served


def rows(sweep: dict, profile) -> dict:
    out = defaultdict(list)
    for c in sweep["cells"]:
        ok = [r for r in c["requests"] if r["status"] == 200]
        spans = served.engine_spans(ok)
        for r, (a, b, k) in zip(ok, spans):
            overlap = served.overlap((a, b), [(a2, b2) for a2, b2, k2 in spans if k2 != k])
            band = "idle" if overlap < 0.2 else "busy" if overlap > 0.8 else "mid"
            pred = served.service_ms(profile, r["method"], r["recomputed_tokens"],
                                     r["context_tokens"])
            cpu = r.get("thread_cpu_ms", np.nan)
            out[(c["series"].split(" @")[0], band)].append(
                (r["ttft_ms"] / pred, cpu / pred, cpu / r["ttft_ms"],
                 r.get("assemble_ms", np.nan), r.get("prefill_ms", np.nan)))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore", category=RuntimeWarning)   # all-blank CPU columns
    sweep = served.load_sweep(argv[0])
    profile = served.fit_profile(load_bench_requests(argv[1]))
    print(f"{'series':18s} {'band':5s} {'n':>4s} {'eng/fit':>8s} {'cpu/fit':>8s} "
          f"{'cpu/eng':>8s} {'assemble':>9s} {'prefill':>8s}")
    for (series, band), vals in sorted(rows(sweep, profile).items()):
        a = np.array(vals, float)
        med = np.nanmedian(a, axis=0) if np.isfinite(a).any() else a[0]
        print(f"{series:18s} {band:5s} {len(a):4d} " + " ".join(
            f"{v:8.2f}" if i < 3 else f"{v:9.0f}" if i == 3 else f"{v:8.0f}"
            for i, v in enumerate(med)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
