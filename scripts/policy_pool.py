"""The routing policies of every recorded served sweep, pooled: per rate, affinity's P50 and
P99 over the mean of hit-only's, load-only's and round-robin's, with a 90% bootstrap interval
over the sweeps, and in how many sweeps affinity's P99 is below both hit-only's and
load-only's (the issue-30 target).

    python scripts/policy_pool.py [docs/results.md]

The record is docs/results.md's "Served sweep" section (a sweep's sweep.json stays on the
machine that ran it): every table there with a "series" header, six rate columns (0.4× … 2.0×
of capacity, in order) and the rcllm-0.3/0.3 series under all four policies, cells
"P50 / P99". One sweep is one sample, so the interval is over sweeps, not requests.
"""

from __future__ import annotations

import re
import sys

import numpy as np

POLICIES = ("affinity", "hit-only", "load-only", "round-robin")
RATES = 6
ROW = re.compile(r"\| rcllm-0\.3/0\.3 @ (\S+) \|(.*)\|\s*$")


def sweep_tables(text: str) -> list[dict[str, np.ndarray]]:
    """{policy: array (rates, 2) of P50, P99} per complete table of the section; key
    "heading": the heading above the table."""
    section = text.split("## Served sweep", 1)[1].split("\n## ", 1)[0]
    tables: list[dict[str, np.ndarray]] = []
    cur: dict | None = None
    heading = ""
    for line in section.splitlines():
        if line.startswith("### "):
            heading = line[4:]
        if line.startswith("| series |"):
            cur = {"heading": heading} if line.count("|") - 2 == RATES else None
            if cur is not None:
                tables.append(cur)
            continue
        m = ROW.match(line)
        if cur is None or m is None:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        try:
            cur[m.group(1)] = np.array([[float(v.replace(",", "")) for v in c.split(" / ")]
                                        for c in cells])
        except ValueError:      # not a "P50 / P99" table
            continue
    return [t for t in tables if all(p in t and t[p].shape == (RATES, 2) for p in POLICIES)]


def main(path: str = "docs/results.md") -> int:
    with open(path, encoding="utf-8") as fh:
        tables = sweep_tables(fh.read())
    if len(tables) < 2:
        print(f"{path}: {len(tables)} complete six-rate policy tables; need 2", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    for t in tables:
        print("  " + t["heading"])
    print(f"{len(tables)} sweeps; affinity / mean(hit-only, load-only, round-robin), "
          "90% bootstrap interval over sweeps")
    for r in range(RATES):
        ratio = np.array([t["affinity"][r] / np.mean([t[p][r] for p in POLICIES[1:]], axis=0)
                          for t in tables])
        boot = ratio[rng.integers(0, len(ratio), (4000, len(ratio)))].mean(axis=1)
        lo, hi = np.percentile(boot, [5, 95], axis=0)
        wins = sum(t["affinity"][r, 1] < min(t["hit-only"][r, 1], t["load-only"][r, 1])
                   for t in tables)
        print(f"rate column {r + 1}: P50 {ratio[:, 0].mean():.3f} [{lo[0]:.3f}, {hi[0]:.3f}]  "
              f"P99 {ratio[:, 1].mean():.3f} [{lo[1]:.3f}, {hi[1]:.3f}]  affinity's P99 below "
              f"hit-only's and load-only's in {wins} of {len(tables)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
