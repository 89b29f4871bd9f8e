"""Fixtures for the evaluation tests: the shared real-data folder (skip when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

# ../shared/data next to the repository root (tests/eval/conftest.py -> parents[2] is the root)
SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """The shared data folder; skips the test when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def write_jsonl(path: Path, rows: list, gz: bool = False) -> Path:
    """Writes rows (dicts, or raw strings written as-is) as JSON lines; gzip if gz."""
    import gzip
    import json

    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def jsonl():
    """The write_jsonl helper, as a fixture so test modules need no imports from here."""
    return write_jsonl
