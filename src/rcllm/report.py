"""The reporting contract shared by every `rcllm bench ...` and `rcllm eval ...` command.

`--json PATH` writes ``{"name": str, "config": {...}, "rows": [{...}, ...], "summary": {...}}``
with numbers in plain units (`_ms`, `_s`, ratios as floats). Each command documents its row and
summary keys in docs/reporting.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterable, Mapping, Sequence


# said wherever an engine without an adapter ranks (rank, the demo, bench ttft, serve's start-up
# log, /healthz and the page at /ui): the bundled base model's rankings do not follow content
UNTUNED_NOTE = ("no adapter (or one that learnt nothing): the base model ranks untuned, its "
                "rankings do not follow the "
                "user's history or the items (speeds are real, rankings are not). Train one for "
                "your data with `rcllm finetune --data PATH --category NAME` and pass "
                "`--adapter DIR` (README, 'Fine-tuning the ranker')")


def _plain(value: Any) -> Any:
    """Converts dataclasses, tuples, numpy and torch scalars into JSON-ready values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null says "not measured"
    return value


def build_report(name: str, config: Any, rows: Sequence[Mapping[str, Any]],
                 summary: Mapping[str, Any]) -> dict:
    return {"name": name, "config": _plain(config), "rows": _plain(list(rows)),
            "summary": _plain(summary)}


def write_report(path: str | os.PathLike, name: str, config: Any,
                 rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> dict:
    """Writes the report atomically (temp file + rename) so a reader never sees half a file."""
    report = build_report(name, config, rows, summary)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)
    return report


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return "-" if value is None else str(value)


def markdown_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Renders rows as a GitHub markdown table with the given column order."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


# ---- comparing a method's ranking with full recompute's (the explain page, eval --html) ----
def softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    s = sum(e)
    return [x / s for x in e]


def compare(ranking: list[str], scores: dict[str, float], full_ranking: list[str] | None,
            full_scores: dict[str, float] | None, candidates: list[str]) -> dict[str, Any]:
    """Per candidate (in the method's ranking order): rank, score, full's rank and score and
    `rank_change` = full's rank - this rank (> 0: the method ranks it higher than full);
    `kl` = KL(full || method) of the softmaxes of the two score vectors over the candidates
    (nats), `top1_agree`. Without full's scores only the method's columns are filled."""
    pos = {c: i + 1 for i, c in enumerate(ranking)}
    full_pos = {c: i + 1 for i, c in enumerate(full_ranking or ())}
    rows = []
    for c in ranking:
        row = {"item_id": c, "rank": pos[c], "score": scores[c], "full_rank": None,
               "full_score": None, "rank_change": None}
        if full_scores is not None:
            row.update(full_rank=full_pos[c], full_score=full_scores[c],
                       rank_change=full_pos[c] - pos[c])
        rows.append(row)
    out: dict[str, Any] = {"rows": rows, "kl": None, "top1_agree": None}
    if full_scores is not None and candidates:
        p = softmax([full_scores[c] for c in candidates])
        q = softmax([scores[c] for c in candidates])
        out["kl"] = sum(pi * (math.log(pi) - math.log(max(qi, 1e-300)))
                        for pi, qi in zip(p, q) if pi > 0)
        out["top1_agree"] = bool(full_ranking and ranking[0] == full_ranking[0])
    return out


def stylesheet() -> str:
    """The explain view's stylesheet: served by the page at /ui and inlined by `eval --html`."""
    from importlib import resources

    return resources.files("rcllm").joinpath("static", "ui.css").read_text("utf-8")
