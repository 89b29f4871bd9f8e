"""Merges repeated `rcllm bench ttft --json` runs into one recorded file of per-request records
(the format of tests/routing/data/ttft_*_cpu.json): per request and variant the fastest of
the runs that measured it three times (`rcllm sim validate --min-repeats 3`), user ids
replaced by request indices (the data stay in ../shared/data).

    python scripts/merge_bench_runs.py OUT.json RUN1.json RUN2.json RUN3.json \
        --recorded-with "rcllm bench ttft ..." --machine "2 cores, quiet"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rcllm.routing.validate import merged_records, scaled_ttft  # noqa: E402
from rcllm.sim.served import load_fit_extras  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("runs", nargs="+")
    p.add_argument("--min-repeats", type=int, default=3)
    p.add_argument("--recorded-with", required=True, help="the bench ttft command line")
    p.add_argument("--machine", required=True, help="the machine and its load")
    args = p.parse_args()
    if Path(args.out).exists():
        sys.exit(f"{args.out} exists: not overwritten (remove it first)")
    merged = merged_records(args.runs, args.min_repeats)
    if not merged:
        sys.exit(f"no request was measured {args.min_repeats} times")
    index = {u: f"r{k}" for k, u in enumerate(dict.fromkeys(r["user_id"] for r in merged))}
    keep = ("method", "variant", "context_tokens", "recomputed_tokens", "reused_tokens",
            "prefix_tokens", "chunk_misses", "ttft_ms", "repeats")
    builds, reference = load_fit_extras(args.runs)
    records = [{"user_id": index[r["user_id"]], **{k: r[k] for k in keep if k in r}}
               for r in merged]
    scaled = reference is not None and all(r.get("run_reference_ms") for r in merged)
    if scaled:  # the winners come from different runs: one speed unit, the runs' mean reference
        for rec, r in zip(records, merged):
            rec["ttft_measured_ms"] = rec["ttft_ms"]
            rec["ttft_ms"] = round(scaled_ttft(r, reference), 1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False,   # the repository's, from any folder
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    report = {"name": "bench_ttft", "config": {
        "recorded_with": args.recorded_with, "commit": commit, "machine": args.machine,
        "note": f"per-request records only; per request and variant the fastest of "
                f"{len(args.runs)} runs (measured {args.min_repeats} times)"
                + (", compared and stored in the units of the runs' mean speed reference "
                   "(ttft_ms = measured · reference / its run's reference; "
                   "ttft_measured_ms as measured)" if scaled else "")
                + "; user ids replaced by request indices"}, "rows": [], "requests": records}
    # what `rcllm sim sweep` reads beside the requests: every run's timed chunk builds and the
    # runs' mean speed reference (absent from runs recorded before they existed)
    report["summary"] = {"chunk_builds": builds,
                         "reference_ms": [] if reference is None else [reference]}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{args.out}: {len(records)} records of {len(index)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
