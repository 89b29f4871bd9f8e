"""PNG figures of the experiments (matplotlib, Agg backend, imported only when plotting)."""

from __future__ import annotations

from ..routing.registry import in_role
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


# ---- rate sweeps: served cells and the simulator's prediction of them --------------
def method_cell(c: dict) -> bool:
    """A cell of a method series (`routing.registry.in_role`: the sweep's own rule)."""
    return in_role(c, "method")


def policy_cell(c: dict) -> bool:
    """A cell of the policy series (`routing.registry.in_role`)."""
    return in_role(c, "policy")


def draw_sweep(ax, cells: list[dict], keep, label, title: str,
               predicted: list[dict] | None = None) -> None:
    """P50 (solid) and P99 (dashed) TTFT against rate on `ax`, one colour per label; with
    `predicted` (the simulator's cells, same keys) hollow markers on dotted lines."""
    import matplotlib.pyplot as plt

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(sorted({label(c) for c in cells if keep(c)})):
        col = colours[i % len(colours)]
        for src, style, suffix in ((cells, ("-o", "--s"), ""), (predicted, (":o", ":s"), " sim")):
            if src is None:
                continue
            mine = sorted((c for c in src if keep(c) and label(c) == name),
                          key=lambda c: c["rate_rps"])
            xs = [c["rate_rps"] for c in mine]
            hollow = {"mfc": "none"} if suffix else {}
            ax.plot(xs, [c["ttft_p50_ms"] for c in mine], style[0], color=col,
                    label=f"{name} P50{suffix}", **hollow)
            ax.plot(xs, [c["ttft_p99_ms"] for c in mine], style[1], color=col,
                    label=f"{name} P99{suffix}", **hollow)
    ax.set_yscale("log")
    ax.set_xlabel("request rate (requests/s)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
