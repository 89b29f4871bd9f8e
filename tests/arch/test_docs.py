"""Docs are references, not diaries (STYLE.md): every docs/*.md but results.md holds at most 500
lines and finetune.md at most 400, so a doc keeps what the part does, how to use it and its
current tables; dated runs go to docs/results.md, which has no limit. A doc over its limit
fails here, every offender named with its count; `test_an_offender_is_named` shows it is caught."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
MAX_LINES = 500
LIMITS = {"finetune.md": 400}
UNLIMITED = {"results.md"}


def offenders(docs: Path = DOCS) -> list[str]:
    out = []
    for path in sorted(docs.glob("*.md")):
        if path.name in UNLIMITED:
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        limit = LIMITS.get(path.name, MAX_LINES)
        if lines > limit:
            out.append(f"docs/{path.name}: {lines} lines (limit {limit})")
    return out


def test_every_doc_but_results_is_within_its_line_limit():
    assert offenders() == []


def test_an_offender_is_named(tmp_path):
    (tmp_path / "serving.md").write_text("x\n" * 501)
    (tmp_path / "finetune.md").write_text("x\n" * 401)
    (tmp_path / "eval.md").write_text("x\n" * 500)
    (tmp_path / "results.md").write_text("x\n" * 5000)
    assert offenders(tmp_path) == ["docs/finetune.md: 401 lines (limit 400)",
                                   "docs/serving.md: 501 lines (limit 500)"]
