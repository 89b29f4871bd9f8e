"""scripts/profile_fast_path.py on the tiny model: the fast path's TTFT split per request, with
the user prefix cached, and the profile of the timed calls."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from rcllm.cli import main

from test_ft_cli import TINY_TRAIN, _model

SCRIPT = Path(__file__).parents[2] / "scripts" / "profile_fast_path.py"


def _script():
    spec = importlib.util.spec_from_file_location("profile_fast_path", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_profile_splits_each_hit_and_names_the_ops(tiny_model_dir, tmp_path, capsys):
    assert main(["finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path),
                 *TINY_TRAIN]) == 0
    adapter = next((tmp_path / "cache" / "adapters").iterdir())
    capsys.readouterr()
    assert _script().main(["--adapter", str(adapter), "--format", "synthetic", "--requests", "3",
                           "--candidates", "5", *_model(tiny_model_dir, tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [m.groups() for m in re.finditer(
        r"ttft +([\d.]+) ms = build +([\d.]+) \+ look-ups/gather +([\d.]+) \+ prefill and scores"
        r" +([\d.]+); (\d+) of (\d+) tokens computed", out)]
    assert len(lines) == 3
    for ttft, build, gather, prefill, computed, tokens in lines:
        # the parts are the TTFT's (rounded to 0.1 ms each); the user side came from the cache
        assert float(build) + float(gather) + float(prefill) == pytest.approx(float(ttft), abs=0.2)
        assert 0 < int(computed) < int(tokens)
    assert "full ttft p50" in out and "linear" in out


def test_profile_needs_an_adapter():
    with pytest.raises(SystemExit, match="--adapter"):
        _script().main(["--format", "synthetic"])
