"""Layering rules, read from the source (every import, function-level ones included).

Packages are the first name under `rcllm` (a top-level module such as `config` counts as one).
The rules: no import cycle between packages; and the named directions below. Each rule is
checked on the import graph; `test_a_broken_rule_fails` shows that a violation is caught.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rcllm"

# (package, packages it must never import): the layers below must not reach up
FORBIDDEN = {
    "errors": {"*"},
    "records": {"*"},
    "config": {"*"},          # the config sections are plain data; nothing is imported
    "model": {"finetune", "engine", "prefill", "userprefix", "serve", "eval", "commands"},
    "kvstore": {"engine", "prefill", "userprefix", "serve", "eval", "finetune", "commands"},
    "prompt": {"engine", "prefill", "userprefix", "serve", "eval", "finetune", "commands"},
    "prefill": {"engine", "userprefix", "serve", "eval", "finetune", "commands"},
    "userprefix": {"engine", "serve", "eval", "finetune", "commands"},
    "finetune": {"userprefix", "engine", "serve", "commands"},
    "eval": {"serve", "commands"},
    "engine": {"serve", "eval", "finetune", "commands"},
}
ALLOWED_BELOW = {"errors", "records", "config"}  # what "*" still lets a base module use


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "rcllm" and len(parts) > 1 else None


def imports_of(path: Path, src: Path = SRC) -> set[str]:
    """Absolute rcllm module names imported anywhere in the file (functions included)."""
    rel = path.relative_to(src.parent).with_suffix("")
    here = list(rel.parts)
    if here[-1] == "__init__":
        here = here[:-1]
    else:
        here = here[:-1]  # the module's package
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("rcllm"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("rcllm"):
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)  # `from . import x`
    return out


def package_graph(src: Path = SRC) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in src.rglob("*.py"):
        mod = ".".join(path.relative_to(src.parent).with_suffix("").parts)
        pkg = package_of(mod) or "__init__"
        deps = {package_of(m) for m in imports_of(path, src)}
        known = {p.stem if p.is_file() else p.name for p in src.iterdir()
                 if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
        graph.setdefault(pkg, set()).update(d for d in deps if d and d != pkg and d in known)
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for pkg, banned in FORBIDDEN.items():
        for dep in sorted(graph.get(pkg, ())):
            if ("*" in banned and dep not in ALLOWED_BELOW) or dep in banned:
                bad.append(f"{pkg} imports {dep}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_layers_import_only_downwards():
    assert violations(package_graph()) == []


def test_no_import_cycle_between_packages():
    assert cycles(package_graph()) == []


def test_a_broken_rule_fails(tmp_path):
    """The checks catch what they guard: a config that imports userprefix, and the cycle it
    closes with a package that imports config, are both reported."""
    pkg = tmp_path / "rcllm"
    (pkg / "userprefix").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def f():\n    from .userprefix.cache import X\n")
    (pkg / "userprefix" / "__init__.py").write_text("")
    (pkg / "userprefix" / "cache.py").write_text("from ..config import Y\n")
    graph = package_graph(pkg)
    assert "config imports userprefix" in violations(graph)
    assert cycles(graph) == [["config", "userprefix"]]
