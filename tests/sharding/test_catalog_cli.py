import json
import subprocess
import sys

from rcllm.cli import main


def test_shard_and_bench_on_synthetic_data(tmp_path, capsys):
    out = tmp_path / "shard.json"
    fig = tmp_path / "fig11.png"
    assert main(["shard", "--data", "-", "--format", "synthetic", "--instances", "4",
                 "--json", str(out), "--figure", str(fig), "--k-max", "5"]) == 0
    report = json.loads(out.read_text())
    assert report["name"] == "shard" and len(report["rows"]) == 4
    rows, summary = report["rows"], report["summary"]
    assert sum(r["shard_items"] for r in rows) + summary["hot_items"] == summary["items"]
    assert all(r["bytes"] == r["tokens"] * 46_080 for r in rows)
    assert 0.0 < summary["hit_rate_candidates"] <= 1.0
    assert [r["instances"] for r in summary["scaling"] if r["method"] == "metis"] == [1, 2, 3, 5]
    assert fig.stat().st_size > 1000
    bench = tmp_path / "bench.json"
    assert main(["bench", "shard", "--data", "-", "--format", "synthetic", "--ks", "2,4",
                 "--json", str(bench)]) == 0
    summary = json.loads(bench.read_text())["summary"]
    assert set(summary) >= {"metis_over_random_candidates_nonhot_k2",
                            "metis_over_random_history_nonhot_k4"}


def test_bad_input_is_a_user_error(capsys):
    assert main(["shard", "--data", "/nonexistent", "--instances", "3"]) == 2
    assert "rcllm: error" in capsys.readouterr().err


def test_catalog_imports_no_torch():
    code = ("import sys, rcllm.sharding, rcllm.commands.shard, rcllm.sharding.trace;"
            "assert 'torch' not in sys.modules, 'catalog imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_shard_on_retrieved_candidates(tmp_path):
    bench = tmp_path / "bench.json"
    assert main(["bench", "shard", "--data", "-", "--format", "synthetic", "--ks", "4",
                 "--candidate-source", "retrieval", "--json", str(bench)]) == 0
    report = json.loads(bench.read_text())
    assert report["config"]["candidate_source"] == "retrieval"
    s = report["summary"]
    assert s["candidate_source"] == "retrieval" and 0.0 < s["retrieval_recall"] <= 1.0
    popularity = tmp_path / "pop.json"
    assert main(["bench", "shard", "--data", "-", "--format", "synthetic", "--ks", "4",
                 "--json", str(popularity)]) == 0
    assert json.loads(popularity.read_text())["summary"]["retrieval_recall"] is None
