"""Size rules, read from the source: no function or method in src/ longer than 60 lines and no
module longer than 400 (docs/architecture.md), so each reads as its phases. A rule broken by a
change fails here, with every offender named; `test_an_offender_is_named` shows it is caught."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rcllm"
MAX_FUNCTION, MAX_MODULE = 60, 400


def offenders(src: Path = SRC) -> list[str]:
    out = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(src.parent)
        lines = len(text.splitlines())
        if lines > MAX_MODULE:
            out.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION:
                    out.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_function_over_60_lines_and_no_module_over_400():
    assert offenders() == []


def test_an_offender_is_named(tmp_path):
    pkg = tmp_path / "rcllm"
    pkg.mkdir()
    body = "\n".join(f"    x{k} = {k}" for k in range(60))
    (pkg / "long.py").write_text(f"def long_one():\n{body}\n")
    (pkg / "short.py").write_text("def short():\n    return 1\n")
    assert offenders(pkg) == ["rcllm/long.py:1 long_one: 61 lines"]
