"""The benchmark's PNG: recurrent-work reduction factor vs budget, one panel per workload."""

from __future__ import annotations

import os
from typing import Any, Sequence


def plot_reduction(rows: Sequence[dict[str, Any]], path: str, methods: Sequence[str]) -> None:
    """Writes a PNG at `path` (Agg backend; no display needed). Planner rows only."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, name in zip(axes[0], workloads):
        for method in methods:
            pts = [(r["budget"], r["reduction_factor"]) for r in rows
                   if r["workload"] == name and r["method"] == method]
            pts = [(m, f) for m, f in pts if f != float("inf")]
            if pts:
                ax.plot(*zip(*pts), label=method, marker="." if method.startswith("dp") else None,
                        linestyle="--" if method == "dp_oracle" else "-")
        ax.set_title(name)
        ax.set_xlabel("checkpoint budget M")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("recurrent-work reduction (x)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
