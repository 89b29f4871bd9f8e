"""PNG figures of the experiments (matplotlib, Agg backend, imported only when plotting)."""

from __future__ import annotations

from .experiments import Series

TITLES = {
    "cdf": ("TTFT (ms)", "CDF", "TTFT CDF (paper Figs 7-8)"),
    "scaling": ("instances", "speedup vs prefix", "RcLLM speedup vs Prefix-Cache (paper Fig 10)"),
    "policy": ("requests/s", "mean TTFT (ms)", "Routing policies (paper Fig 12)"),
    "ratio": ("recompute ratio (items = history)", "TTFT (ms)", "TTFT vs recompute (paper Fig 13)"),
}


def plot(experiment: str, series: Series, path: str, subtitle: str = "") -> None:
    """Writes one line chart of `series` to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabel, ylabel, title = TITLES[experiment]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="" if experiment == "cdf" else "o", label=name)
    if experiment == "scaling":
        ax.set_xscale("log")
    if experiment == "policy":
        ax.set_yscale("log")  # overloaded policies blow up by orders of magnitude
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
