"""The outputs of `rcllm sim sweep` (sim/served.py predicts; this writes): the comparison's JSON,
markdown table and figure."""

from __future__ import annotations

import json
import os

from ..routing.profiles import SpeedProfile

COLUMNS = ("rate_rps", "series", "below_capacity", "routing", "measured_p50_ms",
           "predicted_p50_ms", "p50_rel_err", "measured_p99_ms", "predicted_p99_ms",
           "p99_rel_err", "measured_engine_p50_ms", "measured_engine_cpu_p50_ms",
           "predicted_service_p50_ms", "behind_ms_per_request", "speed_scale")
# with --routing caches, the hit ratios beside them
HIT_COLUMNS = ("measured_chunk_hit_ratio", "predicted_chunk_hit_ratio", "chunk_hit_err",
               "measured_item_token_hit_ratio", "predicted_item_token_hit_ratio",
               "measured_kv_imported_items", "predicted_kv_imported_items")


def write_outputs(sweep: dict, rows: list[dict], summary: dict, profile: SpeedProfile,
                  out: str, config: dict) -> None:
    """sim_sweep.json, sim_sweep.md and sim_sweep.png (measured and predicted on one figure)."""
    from ..report import markdown_table

    os.makedirs(out, exist_ok=True)
    report = {"name": "sim.sweep", "config": config, "rows": rows, "summary": summary,
              "profile": {"name": profile.name, "fixed_ms": profile.fixed_ms,
                          "ms_per_token": profile.ms_per_token,
                          "ms_per_token_ctx": profile.ms_per_token_ctx,
                          "reuse_ms_per_token": profile.reuse_ms_per_token}}
    with open(os.path.join(out, "sim_sweep.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, default=str)
    table = markdown_table(rows, COLUMNS + (HIT_COLUMNS if summary.get("router_profile")
                                            else ()))
    with open(os.path.join(out, "sim_sweep.md"), "w", encoding="utf-8") as fh:
        fh.write(f"# simulator vs served sweep ({summary['routing']} routing, profile "
                 f"{profile.name})\n\n{table}\n")
    print(table)
    plot_compare(sweep["cells"], summary["predicted"], os.path.join(out, "sim_sweep.png"))


def plot_compare(cells: list[dict], predicted: list[dict], path: str) -> None:
    """Served (filled) and simulated (hollow) TTFT on one figure: methods | policies."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import draw_sweep, method_cell, policy_cell

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    draw_sweep(axes[0], cells, method_cell, lambda c: c["method"],
               "per method: served (filled) vs simulated (hollow)", predicted)
    draw_sweep(axes[1], cells, policy_cell, lambda c: c["policy"],
               "per routing policy: served vs simulated", predicted)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
