"""`rcllm bench checkpoints` end to end (tiny sizes), and the planner's no-torch layering."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rcllm.cli import main

SMALL = ["--set", "n=512", "--set", "max_budget=4", "--set", "train_requests=300",
         "--set", "speed_n=2000", "--set", "speed_m=8", "--set", "model_n=200",
         "--set", "model_requests=4", "--set", "model_workloads=long_doc,system_prompt"]


def test_bench_writes_report_and_png(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["bench", "checkpoints", *SMALL, "--json", str(out), "--png", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "| workload | M | dp |" in printed and "planner: N = 2000, M = 8" in printed
    report = json.loads(out.read_text())
    assert report["name"] == "bench.checkpoints" and report["config"]["n"] == 512
    planner = [r for r in report["rows"] if r["part"] == "planner"]
    model = [r for r in report["rows"] if r["part"] == "model"]
    assert len(planner) == 4 * 4 * 6 and len(model) > 0
    for r in planner:  # the oracle DP is never beaten by a distribution-blind schedule
        if r["method"] in ("balanced", "block", "log", "sqrt"):
            oracle = next(o for o in planner if o["workload"] == r["workload"]
                          and o["budget"] == r["budget"] and o["method"] == "dp_oracle")
            assert oracle["expected_recompute_tokens"] <= r["expected_recompute_tokens"] + 1e-9
    assert all(r["exact"] for r in model)
    assert all(r["replayed_tokens"] <= r["depth"] for r in model)
    s = report["summary"]
    assert s["model.all_exact"] is True and s["planner_n"] == 2000
    assert 0 <= s["model.long_doc.dp.tokens_saved_frac"] <= 1
    assert png.stat().st_size > 1000


def test_bad_option_is_a_clean_error(capsys):
    assert main(["bench", "checkpoints", "--set", "max_budget=0", "--png", ""]) == 2
    assert "max_budget" in capsys.readouterr().err


def test_planner_modules_do_not_import_torch():
    code = ("import sys; import rcllm.checkpoints.planner, rcllm.checkpoints.baselines, "
            "rcllm.checkpoints.distributions, rcllm.checkpoints.store, rcllm.bench.checkpoints; "
            "assert 'torch' not in sys.modules, 'planner pulled in torch'")
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
