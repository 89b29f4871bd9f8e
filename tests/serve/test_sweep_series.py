"""The served sweep's series (loadgen/series.py): the policy series' method is an option
(`--policy-method`, issue 62 item 1), checked before any model loads, and each cell says which
series it belongs to (`roles`), old sweeps read as before. No Ray."""

from __future__ import annotations

import argparse

import pytest

from rcllm.errors import RcllmError
from rcllm.loadgen import series as sw
from rcllm.loadgen.targets import sweep_targets


def test_the_policy_series_runs_the_method_asked_for():
    out = sw.series_of("full,prefix,rcllm:0.15:0.15", "affinity,load-only", False,
                       policy_method="rcllm:0.15:0.15")
    roles = {(s.name, s.policy): s.roles for s in out}
    # its affinity cell is the method series' own; under load-only it is a policy cell only
    assert roles[("rcllm-0.15/0.15", "affinity")] == ("method", "policy")
    assert roles[("rcllm-0.15/0.15", "load-only")] == ("policy",)
    assert not any(s.name == "rcllm-0.3/0.3" for s in out)
    assert out[-1].body({}) == {"method": "rcllm", "item_ratio": 0.15, "history_ratio": 0.15}
    # a method not among --methods: every one of its cells is a policy cell
    out = sw.series_of("full", "affinity,cost", False, policy_method="late")
    assert [(s.name, s.policy, s.roles) for s in out[1:]] == [
        ("late", "affinity", ("policy",)), ("late", "cost", ("policy",))]


@pytest.mark.parametrize("bad", ["rcllm:fast:0.3", "rcllm:0.3", "turbo", "adapter"])
def test_a_bad_policy_method_is_refused(bad):
    with pytest.raises(RcllmError):
        sw.series_of("full", "affinity", adapter=False, policy_method=bad)


def test_a_bad_method_is_refused_with_the_known_ones():
    with pytest.raises(RcllmError, match="known: full, prefix"):
        sw.series_of("full,turbo:0.3:0.3", "", adapter=False)


def test_the_option_is_checked_before_any_model_loads(monkeypatch, tmp_path):
    import rcllm.launch as launch
    from rcllm.commands.bench_serve import register_bench

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before the options were checked")

    monkeypatch.setattr(launch, "load_data", no_load)
    top = argparse.ArgumentParser()
    register_bench(top.add_subparsers())
    args = top.parse_args(["serve", "--sweep", "--out", str(tmp_path)])
    assert args.policy_method == sw.POLICY_METHOD
    args = top.parse_args(["serve", "--sweep", "--policy-method", "rcllm:0.15", "--out",
                           str(tmp_path)])
    from rcllm.loadgen.sweep import run_sweep

    with pytest.raises(RcllmError, match="METHOD:ITEM_RATIO:HISTORY_RATIO"):
        run_sweep(args)


def _cell(method, policy, p99, roles=None):
    c = {"method": method, "policy": policy, "rate_rps": 1.0, "ttft_p99_ms": p99,
         "goodput_rps": 1.0, "ok": 10, "rejected_429": 0, "lost": 0, "errors_5xx": 0}
    return c if roles is None else {**c, "roles": roles}


def test_targets_read_the_policy_series_from_the_cells_roles():
    cells = [_cell("prefix", "load-only", 900, ["method"]),
             _cell("late", "affinity", 300, ["method", "policy"]),
             _cell("late", "hit-only", 500, ["policy"]),
             _cell("late", "load-only", 400, ["policy"])]
    t = sweep_targets(cells, 5000)
    assert t["p99_lower_than_baseline"] == {"late": 3.0}       # policy cells are not methods
    assert t["policies_at_top_rates"][0]["affinity_lowest"] is True
    # a sweep recorded before cells carried roles: rcllm 0.3/0.3 is the policy series
    old = [_cell("prefix", "load-only", 900), _cell("rcllm-0.3/0.3", "affinity", 300),
           _cell("rcllm-0.3/0.3", "hit-only", 200), _cell("rcllm-0.3/0.3", "load-only", 400)]
    t = sweep_targets(old, 5000)
    assert t["p99_lower_than_baseline"] == {"rcllm-0.3/0.3": 3.0}
    assert t["policies_at_top_rates"][0]["affinity_lowest"] is False
