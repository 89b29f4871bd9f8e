"""Layering rules, read from the source (every import, function-level ones included).

Packages are the first name under `rcllm` (a top-level module such as `config` counts as one).
The rules: no import cycle between packages; and the named directions below, one rule for
every package (`rcllm/__init__.py` counts as the package `__init__`). Each rule is checked on
the import graph; `test_a_broken_rule_fails` shows that a violation is caught.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rcllm"

# the faces over the engine and the tools over them: nothing at or below the engine imports them
UPPER = {"launch", "serve", "loadgen", "bench", "commands", "cli"}
# the torch side (prompt: the tokenizer): the scheduler, the simulator and sharding stay plain
ENGINE = {"model", "kvstore", "prompt", "prefill", "prototypes", "userprefix", "engine",
          "finetune", "checkpoints"}

# (package, packages it must never import): the layers below must not reach up. Every package
# has a rule (`test_every_package_has_a_rule`), so a new one is placed when it is added.
FORBIDDEN = {
    "__init__": {"*"},
    "errors": {"*"},
    "records": {"*"},
    "config": {"*"},          # the config sections are plain data; nothing is imported
    "report": {"*"},          # the reporting contract, shared by serve, eval and bench
    "cli": {"*"},             # command modules are imported by name, per run
    "model": {"finetune", "engine", "prefill", "userprefix", "eval"} | UPPER,
    "kvstore": {"engine", "prefill", "userprefix", "eval", "finetune"} | UPPER,
    "prompt": {"engine", "prefill", "userprefix", "eval", "finetune"} | UPPER,
    "prefill": {"engine", "userprefix", "eval", "finetune"} | UPPER,
    "prototypes": {"engine", "userprefix", "eval", "finetune"} | UPPER,
    "checkpoints": {"engine", "userprefix", "eval", "finetune"} | UPPER,
    "userprefix": {"engine", "eval", "finetune"} | UPPER,
    "finetune": {"userprefix", "engine"} | UPPER,
    "eval": UPPER,
    "engine": {"eval", "finetune"} | UPPER,
    "sharding": ENGINE | {"sim", "routing"} | UPPER,
    "routing": ENGINE | {"sim", "eval", "sharding"} | UPPER,
    "sim": ENGINE | UPPER,
    "launch": {"sim", "serve", "loadgen", "bench", "commands", "cli"},
    "serve": {"loadgen", "bench", "commands", "cli"},
    # load generation and the served sweep drive the served face from above, as a client does
    "loadgen": {"bench", "commands", "cli"},
    # measurement code does not import the serving face (the served sweep is `loadgen`'s)
    "bench": {"serve", "loadgen", "launch", "commands", "cli"},
    "commands": {"cli"},
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


def packages(src: Path = SRC) -> set[str]:
    """Every package: each top-level module and each folder with an `__init__.py`."""
    return {p.stem if p.is_file() else p.name for p in src.iterdir()
            if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}


def package_graph(src: Path = SRC) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    known = packages(src)
    for path in src.rglob("*.py"):
        mod = ".".join(path.relative_to(src.parent).with_suffix("").parts)
        pkg = package_of(mod) or "__init__"
        deps = {package_of(m) for m in imports_of(path, src)}
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


def test_every_package_has_a_rule():
    """A package without a rule could import anything: each one is placed in the layers."""
    assert packages() == set(FORBIDDEN)


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
