"""`bench prefill`: the headline compares against transformers' last-position logits."""

import json

import pytest

from rcllm.cli import main
from rcllm.commands.bench_prefill import headline, summarize


def _tiny(model_dir, *args):
    return ["bench", "prefill", "--set", f"model.path={model_dir}", "--set", "model.threads=0",
            *args]


def test_report_and_headline(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "prefill.json"
    assert main(_tiny(tiny_model_dir, "--tokens", "64,2048", "--repeats", "1",
                      "--json", str(path))) == 0
    report = json.loads(path.read_text())
    assert report["name"] == "bench_prefill" and report["config"]["tokens"] == [64, 2048]
    row = report["rows"][1]
    assert row["speedup_vs_transformers_last"] == pytest.approx(
        row["transformers_last_ms"] / row["engine_ms"])
    assert row["speedup_vs_transformers_all"] == pytest.approx(
        row["transformers_all_ms"] / row["engine_ms"])
    s = report["summary"]
    assert s["speedup_vs_transformers_last_2048"] == row["speedup_vs_transformers_last"]
    assert s["speedup_vs_transformers_all_2048"] == row["speedup_vs_transformers_all"]
    assert "last-position logits (headline" in capsys.readouterr().out


def test_headline_names_the_fair_comparison_first():
    rows = [{"tokens": 2048, "speedup_vs_transformers_last": 1.1,
             "speedup_vs_transformers_all": 1.9, "floor_ratio": 0.8}]
    text = headline(summarize(rows, 100.0, 2))
    assert text.index("1.10x") < text.index("1.90x")
    assert summarize([{"tokens": 512, "speedup_vs_transformers_last": 1.0,
                       "speedup_vs_transformers_all": 1.0, "floor_ratio": 1.0}],
                     100.0, 2)["speedup_vs_transformers_last_2048"] is None


def test_bad_tokens_is_a_clear_error(tiny_model_dir, capsys):
    assert main(_tiny(tiny_model_dir, "--tokens", "abc")) == 2
    assert "--tokens" in capsys.readouterr().err
