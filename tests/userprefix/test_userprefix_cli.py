"""`register` adds the two bench commands; the relay simulation and its report."""

from __future__ import annotations

import argparse
import json

import numpy as np

from rcllm.commands.userprefix import register
from rcllm.userprefix.relay_sim import SimParams, max_rate, simulate, user_lengths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rcllm")
    top = parser.add_subparsers(dest="command")
    bench = top.add_parser("bench").add_subparsers(dest="bench")
    register(top, bench)
    return parser


def test_register_adds_userprefix_commands():
    args = _parser().parse_args(["bench", "userprefix", "--candidates", "5,10"])
    assert args.candidates == "5,10" and args.prefix_tokens == 1500 and callable(args.func)


def test_relay_bench_report(tmp_path):
    out = tmp_path / "relay.json"
    args = _parser().parse_args(["bench", "userprefix-relay", "--requests", "600",
                                 "--json", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    base, relay = report["rows"]
    assert report["name"] == "bench_userprefix_relay"
    assert relay["slo_throughput_per_s"] >= base["slo_throughput_per_s"]
    assert relay["longest_tokens"] >= base["longest_tokens"]


def test_relay_removes_prefix_from_the_critical_path():
    p = SimParams(requests=500)
    tokens = np.full(p.requests, 2000)
    base = simulate(p, 2.0, tokens, relay=False)   # a nearly idle cluster
    relay = simulate(p, 2.0, tokens, relay=True)
    full = p.fixed_ms + p.per_token_ms * 2000 + p.per_candidate_ms * p.candidates
    assert np.median(base) >= full - 1e-9
    assert np.median(relay) < full - 0.9 * p.per_token_ms * 2000


def test_short_users_are_not_prewarmed():
    p = SimParams(requests=300)
    tokens = np.full(p.requests, 100)  # under min_prefix_tokens: the trigger declines
    assert np.allclose(simulate(p, 5.0, tokens, True), simulate(p, 5.0, tokens, False))
    assert max_rate(p, user_lengths(p, 1500), True, 1.0) == 0.0  # an impossible SLO


def test_relay_simulation_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, rcllm.userprefix.relay_sim; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_bench_runs_on_the_tiny_model(tiny_loaded):
    from rcllm.bench.userprefix import run_bench

    rows, summary = run_bench(tiny_loaded, [3, 5], prefix_tokens=300, independent=2, repeats=1,
                              append_entries=2, seed=0)
    assert [r["candidates"] for r in rows] == [3, 5]
    assert summary["max_abs_diff"] < 1e-5 and summary["independent_extrapolated"]
    assert summary["append_drift_k_max_abs"] < 1e-4
    assert summary["prefix_bytes_int8"] < 0.3 * summary["prefix_bytes_float"]


def test_no_lead_time_no_gain():
    from dataclasses import replace

    p = replace(SimParams(requests=400), lead_ms=0.0)
    tokens = user_lengths(p, 1500)
    assert np.array_equal(simulate(p, 20.0, tokens, False), simulate(p, 20.0, tokens, True))
