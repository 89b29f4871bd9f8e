"""The served face's size rule, tighter than the code's (issue 62 item 4): no function or method
in src/rcllm/serve/ longer than 50 lines (`create_app` included), so the router and the app
read as their phases. The reading is `test_shape.offenders`' AST walk; a rule broken by a
change fails here with every offender named, and `test_an_offender_in_serve_is_named` shows
one is caught."""

from __future__ import annotations

import ast
from pathlib import Path

SERVE = Path(__file__).resolve().parents[2] / "src" / "rcllm" / "serve"
MAX_FUNCTION = 50


def long_functions(src: Path = SERVE, limit: int = MAX_FUNCTION) -> list[str]:
    """'<file>:<line> <name>: <n> lines' for every function of `src` over `limit` lines."""
    out = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(src.parent)}:{node.lineno} {node.name}: "
                               f"{n} lines")
    return out


def test_no_function_in_serve_over_50_lines():
    assert SERVE.is_dir() and any(SERVE.rglob("router.py"))
    assert long_functions() == []


def _function(name: str, lines: int, indent: str = "") -> str:
    """Source of a function `lines` lines long (its def line included)."""
    return "\n".join([f"{indent}def {name}(self):"]
                     + [f"{indent}    x{k} = {k}" for k in range(lines - 1)]) + "\n"


def test_an_offender_in_serve_is_named(tmp_path):
    pkg = tmp_path / "serve"
    pkg.mkdir()
    # a method one line over the limit is named; one exactly at it passes
    (pkg / "router.py").write_text("class RayBackend:\n" + _function("_route", 51, "    ")
                                   + _function("_call", 50, "    "))
    (pkg / "app.py").write_text(_function("create_app", 50))
    assert long_functions(pkg) == ["serve/router.py:2 _route: 51 lines"]
