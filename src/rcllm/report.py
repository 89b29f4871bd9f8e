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
