import json

import numpy as np

from rcllm.cli import main
from rcllm.sim import SyntheticSpec, synthetic_workload
from rcllm.sim.experiments import Scenario, policy_experiment, scaling_experiment


def test_sim_run_writes_json_png_markdown(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["sim", "run", "cdf", "--requests", "400", "--items", "3000",
                 "--out", str(out)]) == 0
    report = json.loads((out / "sim_cdf.json").read_text())
    assert report["name"] == "sim.cdf"
    assert [r["method"] for r in report["rows"]] == ["full", "prefix", "rcllm"]
    rc = report["rows"][2]
    assert rc["p50_speedup_vs_prefix"] > 1.0
    cdf = report["summary"]["series"]["rcllm"]
    assert len(cdf["x"]) == 101 and cdf["y"][-1] == 1.0
    assert (out / "sim_cdf.png").stat().st_size > 1000
    assert "| rcllm |" in (out / "sim_cdf.md").read_text()


def test_ratio_experiment_via_cli_is_monotone(tmp_path):
    out = tmp_path / "o"
    assert main(["sim", "run", "ratio", "--requests", "400", "--items", "3000",
                 "--out", str(out)]) == 0
    rows = json.loads((out / "sim_ratio.json").read_text())["rows"]
    p50 = [r["p50_ttft_ms"] for r in rows]
    assert p50 == sorted(p50)


def test_scaling_and_policy_experiments_small():
    w = synthetic_workload(SyntheticSpec(num_items=3000, num_requests=300, num_communities=30))
    rows, series = scaling_experiment(w, Scenario(), ks=(1, 4))
    assert [r["instances"] for r in rows] == [1, 4] and set(series) == {"P50", "P99"}
    assert all(r["p50_speedup"] > 1.0 for r in rows)
    rows, series = policy_experiment(w, Scenario(), k=4, loads=(0.5,),
                                     policies=("load-only", "affinity"))
    assert len(rows) == 2 and all(np.isfinite(r["mean_ttft_ms"]) for r in rows)


def test_bench_and_profiles_commands(capsys):
    assert main(["bench", "sim", "--requests", "500", "--instances", "4"]) == 0
    out = capsys.readouterr().out
    assert "simulator: 500 requests" in out and "affinity" in out
    assert main(["sim", "profiles"]) == 0
    assert "qwen-72b@a100" in capsys.readouterr().out


def test_bench_sim_json_follows_the_reporting_contract(tmp_path, capsys):
    path = tmp_path / "sim.json"
    assert main(["bench", "sim", "--requests", "300", "--instances", "3",
                 "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert set(report) == {"name", "config", "rows", "summary"}
    assert report["name"] == "bench_sim"
    assert report["config"]["requests"] == 300 and report["config"]["instances"] == 3
    policies = {r["policy"] for r in report["rows"]}
    assert policies == {"round-robin", "load-only", "hit-only", "affinity", "cost"}
    s = report["summary"]
    assert s["simulator_requests"] == 300 and s["simulator_wall_s"] > 0
    assert s["max_decision_us"] == max(r["decision_us"] for r in report["rows"])
    assert main(["bench", "sim", "--requests", "0"]) == 2


def test_sim_run_on_retrieved_candidates(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["sim", "run", "cdf", "--requests", "300", "--data", "-", "--format",
                 "synthetic", "--candidate-source", "retrieval", "--out", str(out)]) == 0
    report = json.loads((out / "sim_cdf.json").read_text())
    assert report["config"]["candidate_source"] == "retrieval"
    assert 0.0 < report["summary"]["retrieval_recall"] <= 1.0
    assert main(["sim", "run", "cdf", "--requests", "300", "--candidate-source", "retrieval",
                 "--out", str(out)]) == 2
    assert "real trace" in capsys.readouterr().err
