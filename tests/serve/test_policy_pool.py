"""scripts/policy_pool.py: the routing policies of the recorded served sweeps, pooled."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

HEADER = "| series | " + " | ".join(f"{r}x" for r in (0.4, 0.7, 1, 1.3, 1.6, 2)) + " |"


def _script():
    path = pathlib.Path(__file__).parents[2] / "scripts" / "policy_pool.py"
    spec = importlib.util.spec_from_file_location("policy_pool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(heading: str, p99: dict[str, float], header: str = HEADER) -> str:
    rows = [f"### {heading}", "", header, "|---|" + "---|" * (header.count("|") - 2),
            "| prefix @ load-only | " + " | ".join(["9,000 / 9,999"] * 6) + " |"]
    for policy, v in p99.items():
        rows.append(f"| rcllm-0.3/0.3 @ {policy} | "
                    + " | ".join([f"1,000 / {v:,.0f}"] * 6) + " |")
    return "\n".join(rows) + "\n\n"


def test_pools_affinity_against_the_other_policies_over_sweeps(tmp_path, capsys):
    """Two complete six-rate tables are two samples; a four-rate table, a table without all
    four policies and the sections outside "Served sweep" are not read."""
    mod = _script()
    four = "| series | 0.5x | 1x | 1.5x | 2x |"
    text = ("# Results\n\n## Fine-tuning\n\n" + _table("not a sweep", dict.fromkeys(
                ("affinity", "hit-only", "load-only", "round-robin"), 1.0))
            + "## Served sweep (serving.md)\n\n"
            + _table("a", {"affinity": 900, "hit-only": 1000, "load-only": 1000,
                           "round-robin": 1000})
            + _table("b", {"affinity": 1200, "hit-only": 1000, "load-only": 1100,
                           "round-robin": 1500})
            + _table("four rates", {"affinity": 1, "hit-only": 1, "load-only": 1,
                                    "round-robin": 1}, four)
            + _table("no round-robin", {"affinity": 1, "hit-only": 1, "load-only": 1})
            + "## Fine-tuning (finetune.md)\n\n" + _table("after", dict.fromkeys(
                ("affinity", "hit-only", "load-only", "round-robin"), 1.0)))
    tables = mod.sweep_tables(text)
    assert [t["heading"] for t in tables] == ["a", "b"]
    assert tables[1]["load-only"].shape == (6, 2)
    assert tables[1]["load-only"][4].tolist() == [1000.0, 1100.0]
    path = tmp_path / "results.md"
    path.write_text(text, encoding="utf-8")
    assert mod.main(str(path)) == 0
    out = capsys.readouterr().out
    expect = np.mean([0.9, 1200 / np.mean([1000, 1100, 1500])])
    assert f"P99 {expect:.3f}" in out and "P50 1.000" in out
    assert out.count("below hit-only's and load-only's in 1 of 2") == 6


def test_refuses_a_record_with_fewer_than_two_sweeps(tmp_path, capsys):
    path = tmp_path / "results.md"
    path.write_text("## Served sweep\n\n" + _table("a", {
        "affinity": 1, "hit-only": 1, "load-only": 1, "round-robin": 1}), encoding="utf-8")
    assert _script().main(str(path)) == 2
    assert "need 2" in capsys.readouterr().err


def test_reads_this_repository_s_record():
    """The record it is run on parses: at least the ten whole sweeps of 2026-12-04/05."""
    path = pathlib.Path(__file__).parents[2] / "docs" / "results.md"
    tables = _script().sweep_tables(path.read_text(encoding="utf-8"))
    assert len(tables) >= 10
    assert all(np.all(t["affinity"] > 0) for t in tables)
