"""`rcllm rank` keeps its chunk KV in the cache folder: a second run reuses what the first
built, a corrupted entry is detected, counted and recomputed (issue 17, item 1)."""

import dataclasses
import json
import re

import pytest

from rcllm.cli import main
from rcllm.commands.common import DEFAULT_SYNTHETIC
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases


@pytest.fixture
def request_file(tmp_path):
    """One leave-last-out request: 3 reviews, 4 candidates = 7 chunks."""
    ds = load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)
    case = build_cases(ds, history_window=3, num_negatives=3, seed=0, max_cases=1)[0]
    path = tmp_path / "req.json"
    path.write_text(json.dumps({"user_id": case.user_id, "candidates": list(case.candidates),
                                "method": "naive", "history": [dataclasses.asdict(h)
                                                               for h in case.history]}))
    return path


def _rank(capsys, tiny_model_dir, cache, request_file, *extra):
    rc = main(["rank", "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0",
               "--set", f"model.cache_dir={cache}", "--request", str(request_file), *extra])
    out = capsys.readouterr().out
    assert rc == 0, out
    hits, misses = map(int, re.search(r"chunk hits (\d+), misses (\d+)", out).groups())
    return hits, misses, out


def test_second_rank_reuses_the_first_runs_chunks(tiny_model_dir, tmp_path, request_file,
                                                  capsys):
    cache = tmp_path / "cache"
    assert _rank(capsys, tiny_model_dir, cache, request_file)[:2] == (0, 7)
    hits, misses, out = _rank(capsys, tiny_model_dir, cache, request_file)
    assert (hits, misses) == (7, 0) and f"chunk store {cache / 'kv'}" in out
    # a truncated entry: detected, counted, recomputed, and stored again
    entry = sorted((cache / "kv").rglob("*.rckv"))[0]
    entry.write_bytes(entry.read_bytes()[:-11])
    hits, misses, out = _rank(capsys, tiny_model_dir, cache, request_file)
    assert (hits, misses) == (6, 1) and "1 corrupt entries dropped and recomputed" in out
    assert _rank(capsys, tiny_model_dir, cache, request_file)[:2] == (7, 0)
    # --no-kv-dir: process memory only, cold every time
    assert _rank(capsys, tiny_model_dir, cache, request_file, "--no-kv-dir")[:2] == (0, 7)


def test_rank_help_says_where_the_store_lives_and_how_to_clear_it(capsys):
    with pytest.raises(SystemExit):
        main(["rank", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "~/.cache/rcllm/kv" in text and "rm -r" in text and "--no-kv-dir" in text


def test_rank_reuses_what_build_cache_stored(tiny_model_dir, tmp_path, request_file, capsys):
    kv = tmp_path / "kv"
    rc = main(["build-cache", "--set", f"model.path={tiny_model_dir}", "--set",
               "model.threads=0", "--kv-dir", str(kv)])
    assert rc == 0 and "items: 120 built" in capsys.readouterr().out
    hits, misses, _ = _rank(capsys, tiny_model_dir, tmp_path / "cache", request_file,
                            "--kv-dir", str(kv))
    assert (hits, misses) == (4, 3)          # the 4 candidates' items; the 3 reviews are new
