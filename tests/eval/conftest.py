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
