"""Saves the tiny random-weight llama of the tests (3 layers, hidden 64, the bundled model's
tokenizer) as a model folder, for `--set model.path=DIR` in the serving benchmarks:

    python scripts/make_tiny_model.py /tmp/rcllm-tiny

It runs the test suite's own `tiny_model_dir` fixture (tests/conftest.py), so the benchmarks'
model is the tests' model by construction.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


class _Folder:
    """Stands in for pytest's tmp_path_factory: `mktemp` gives the requested folder."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def mktemp(self, _name: str) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out


def main(out: str) -> None:
    import conftest
    from rcllm.config import ModelConfig
    from rcllm.model.loading import load_model

    fixture = getattr(conftest.tiny_model_dir, "__wrapped__", conftest.tiny_model_dir)
    print(fixture(load_model(ModelConfig()), _Folder(out)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rcllm-tiny")
