"""Rows and figures for `rcllm shard` and `rcllm bench shard`: plain dicts, no printing."""

from __future__ import annotations

from typing import Sequence

from .sharding import Placement, build_placement
from .trace import Trace

# SmolLM2-135M, fp32: 30 layers × 3 KV heads × 64 dims × (K and V) × 4 bytes = 46,080 B/token.
SMOLLM2_FP32_BYTES_PER_TOKEN = 46_080


def shard_rows(p: Placement, bytes_per_token: int) -> list[dict]:
    """One row per instance: its non-hot items, then everything it caches (incl. hot)."""
    shard_items, shard_tokens = p.shard_items(), p.shard_tokens()
    hot_tokens = sum(p.tokens(i) for i in p.hot)
    return [{"instance": s, "shard_items": len(shard_items[s]), "shard_tokens": shard_tokens[s],
             "items": len(shard_items[s]) + len(p.hot), "tokens": shard_tokens[s] + hot_tokens,
             "bytes": (shard_tokens[s] + hot_tokens) * bytes_per_token}
            for s in range(p.num_instances)]


def hit_rates(p: Placement, trace: Trace) -> dict[str, float]:
    """Local hit rate per held-out view, with and without hot items."""
    out = {}
    for view, reqs in trace.heldout.items():
        out[f"hit_rate_{view}"] = p.local_hit_rate(reqs, include_hot=True)
        out[f"hit_rate_{view}_nonhot"] = p.local_hit_rate(reqs, include_hot=False)
    return out


def sweep(trace: Trace, ks: Sequence[int], methods: Sequence[str], hot_fraction: float,
          seed: int, bytes_per_token: int) -> list[dict]:
    """Rows (K, method): per-instance tokens (mean, max), bytes, and hit rates."""
    rows = []
    for k in ks:
        for method in methods:
            p = build_placement(trace.train, trace.token_counts, k, hot_fraction, method, seed)
            tokens = p.instance_tokens()
            rows.append({"instances": k, "method": method, "hot_items": len(p.hot),
                         "tokens_per_instance_mean": sum(tokens) / k,
                         "tokens_per_instance_max": max(tokens),
                         "bytes_per_instance_max": max(tokens) * bytes_per_token,
                         **hit_rates(p, trace)})
    return rows


def plot_scaling(rows: list[dict], path: str, title: str) -> None:
    """The paper's Figure 11: per-instance tokens and local hit rate vs instance count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tok, ax_hit) = plt.subplots(1, 2, figsize=(10, 4))
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        mine = [r for r in rows if r["method"] == method]
        ks, color = [r["instances"] for r in mine], f"C{i}"
        ax_tok.plot(ks, [r["tokens_per_instance_max"] for r in mine], marker="o", color=color,
                    label=method)
        ax_hit.plot(ks, [r["hit_rate_candidates"] for r in mine], marker="o", color=color,
                    label=f"{method} (candidates)")
        ax_hit.plot(ks, [r["hit_rate_history"] for r in mine], marker="x", linestyle="--",
                    color=color, label=f"{method} (history)")
    ax_tok.set(xscale="log", yscale="log", xlabel="instances K",
               ylabel="item tokens per instance (max)", title="cache size per instance")
    ax_hit.set(xscale="log", xlabel="instances K", ylabel="local hit rate (token-weighted)",
               ylim=(0, 1.02), title="hit rate on held-out requests")
    for ax in (ax_tok, ax_hit):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
