"""Training and validation curves of a run: `curves.json` and `curves.png` next to the adapter,
and the text `rcllm finetune` prints.

Every cross-entropy is drawn against its chance line, ln(candidates): a loss that stays on it
learnt nothing, whatever one metric says. Training rows are windows of `log_every` steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .adapter import write_atomic

JSON, PNG = "curves.json", "curves.png"


def windows(rows: list[dict], every: int) -> list[dict]:
    """Means of consecutive windows of `every` per-step rows; "step" is the window's last."""
    out = []
    for i in range(0, len(rows), every):
        part = rows[i:i + every]
        keys = [k for k in part[0] if k != "step"]
        out.append({"step": part[-1]["step"],
                    **{k: sum(r[k] for r in part) / len(part) for k in keys}})
    return out


def curves(train_rows: list[dict], val_rows: list[dict], every: int, candidates: int,
           val_candidates: int, best_step: int | None) -> dict:
    return {"train": windows(train_rows, every), "validation": val_rows,
            "chance_ce_train": math.log(candidates), "chance_ce_validation":
            math.log(val_candidates), "best_step": best_step}


def save(folder: Path, data: dict, title: str) -> None:
    """Writes curves.json and curves.png (the PNG only when matplotlib is importable)."""
    write_atomic(folder / JSON, lambda tmp: Path(tmp).write_text(json.dumps(data, indent=1)))
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    tr, va = data["train"], data["validation"]
    for key, style in (("ce_full", "-"), ("ce_reuse", "-"), ("kl", ":")):
        if tr and key in tr[0]:
            ax.plot([r["step"] for r in tr], [r[key] for r in tr], style, label=f"train {key}")
    for key in ("ce_full", "ce_reuse"):
        if va and key in va[0]:
            ax.plot([r["step"] for r in va], [r[key] for r in va], "o--", label=f"val {key}")
    ax.axhline(data["chance_ce_train"], color="grey", lw=1,
               label=f"ln {round(math.exp(data['chance_ce_train']))} (train chance)")
    ax.axhline(data["chance_ce_validation"], color="black", lw=1, ls="--",
               label=f"ln {round(math.exp(data['chance_ce_validation']))} (val chance)")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("cross-entropy of the target")
    ax.legend(fontsize=7)
    for key in ("ndcg10_full", "ndcg10_reuse"):
        if va and key in va[0]:
            bx.plot([r["step"] for r in va], [r[key] for r in va], "o-", label=f"val {key}")
    if data.get("best_step") is not None:
        bx.axvline(data["best_step"], color="grey", lw=1, ls=":", label="kept checkpoint")
    bx.set_xlabel("optimiser step")
    bx.set_ylabel("validation NDCG@10")
    bx.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    write_atomic(folder / PNG, lambda tmp: fig.savefig(tmp, format="png", dpi=90))
    plt.close(fig)


def text(data: dict) -> list[str]:
    """The curves as lines of text (training windows, then validations)."""
    lines = [f"training (step: CE full/reuse, KL, top-1 full/reuse; chance "
             f"ln C = {data['chance_ce_train']:.3f}):"]
    rows = data["train"]
    shown = rows[:: max(1, len(rows) // 24)]
    for r in shown + [r for r in rows[-1:] if r is not shown[-1]]:
        lines.append("  " + f"{r['step']:>5}: " + "  ".join(
            f"{k} {r[k]:.3f}" for k in ("ce_full", "ce_reuse", "kl", "top1_full", "top1_reuse")
            if k in r))
    lines.append(f"validation (chance ln C = {data['chance_ce_validation']:.3f}; kept "
                 f"step {data.get('best_step')}):")
    for r in data["validation"]:
        lines.append("  " + f"{r['step']:>5}: " + "  ".join(
            f"{k} {r[k]:.3f}" for k in ("ndcg10_full", "ndcg10_reuse", "ce_full", "ce_reuse",
                                        "top1_full", "top1_reuse") if k in r))
    return lines
