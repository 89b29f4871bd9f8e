"""`rcllm sim sweep` (issue 30 item 2): the simulator's prediction of a served sweep from a
profile fitted on a separate bench ttft run — the FIFO-per-instance model and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rcllm.routing.fit import predict_ms
from rcllm.sim import served, served_cluster, slowdown
from rcllm.commands.sim import register


def _fit_records(rng):
    """bench ttft-like records made by a known linear model (fixed 20 ms, 1 ms per computed
    token, reuse 0.1 ms per reused token for prefix/rcllm)."""
    out = []
    for method in ("full", "prefix", "rcllm"):
        for _ in range(8):
            ctx = int(rng.integers(300, 900))
            comp = ctx if method == "full" else int(ctx * (0.8 if method == "prefix" else 0.3))
            ms = 20 + comp + 0.1 * (ctx - comp) * (method != "full")
            out.append({"method": method, "context_tokens": ctx, "recomputed_tokens": comp,
                        "reused_tokens": ctx - comp, "ttft_ms": ms})
    return out


def _request(method, ctx, comp, instance, status=200):
    return {"status": status, "method": method, "context_tokens": ctx,
            "recomputed_tokens": comp, "instance": instance}


def test_fifo_model_queues_only_when_busy():
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    one = float(predict_ms(profile, "full", np.array([500]), np.array([500]))[0])
    assert one == pytest.approx(520, rel=0.02)
    reqs = [_request("full", 500, 500, 0) for _ in range(3)]
    # spaced far apart: TTFT = service; all at once on one instance: they queue
    ttft, _svc, own = served.simulate_cell([0, 10, 20], reqs, profile, 2, "affinity")
    np.testing.assert_allclose(ttft, one, rtol=1e-6)
    assert not own
    ttft, _svc, _ = served.simulate_cell([0, 0, 0], reqs, profile, 2, "affinity")
    np.testing.assert_allclose(ttft, [one, 2 * one, 3 * one], rtol=1e-6)
    # load-only simulated spreads the same burst over both instances
    ttft, _svc, own = served.simulate_cell([0, 0, 0], reqs, profile, 2, "load-only", "policy")
    assert own and sorted(ttft) == pytest.approx([one, one, 2 * one])
    # refused requests take no service
    ttft, _, _ = served.simulate_cell([0, 0], [_request("full", 500, 500, 0, 429), reqs[0]],
                                      profile, 2, "affinity")
    assert ttft == pytest.approx([one])


def test_sim_sweep_cli_writes_the_comparison(tmp_path):
    import argparse

    rng = np.random.default_rng(1)
    fit = tmp_path / "ttft.json"
    fit.write_text(json.dumps({"requests": _fit_records(rng)}))
    cells = []
    for rate in (1.0, 50.0):
        arrivals = (np.arange(6) / rate).tolist()
        reqs = [_request("rcllm", 600, 180, k % 2) for k in range(6)]
        if rate == 1.0:   # the engine thread's CPU, recorded by sweeps since it existed
            for k, r in enumerate(reqs):
                r["thread_cpu_ms"] = 100.0 + k
        lat = served.simulate_cell(arrivals, reqs, served.fit_profile(_fit_records(
            np.random.default_rng(1))), 2, "affinity")[0] * 1.1     # measured 10% slower
        cells.append({"rate_rps": rate, "series": "rcllm-0.3/0.3 @ affinity",
                      "method": "rcllm-0.3/0.3", "policy": "affinity", "arrivals_s": arrivals,
                      "requests": reqs, "ttft_p50_ms": float(np.percentile(lat, 50)),
                      "ttft_p99_ms": float(np.percentile(lat, 99)),
                      "engine_ttft_p50_ms": 200.0})
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"name": "bench.serve.sweep", "instances": 2,
                                 "capacity_rps": 10.0, "cells": cells}))
    top = argparse.ArgumentParser()
    bench = argparse.ArgumentParser().add_subparsers()
    register(top.add_subparsers(), bench)
    out = tmp_path / "out"
    args = top.parse_args(["sim", "sweep", "--sweep-json", str(sweep), "--fit-json", str(fit),
                           "--out", str(out)])
    assert args.func(args) == 0
    report = json.loads((out / "sim_sweep.json").read_text())
    rows = report["rows"]
    assert [r["below_capacity"] for r in rows] == [True, False]
    for r in rows:
        assert r["p50_rel_err"] == pytest.approx(1 - 1 / 1.1, abs=1e-6)
    assert report["summary"]["within_15pct_below_capacity"] == 1
    assert [r["measured_engine_cpu_p50_ms"] for r in rows] == [102.5, None]
    assert report["summary"]["median_engine_cpu_over_predicted_service"] == pytest.approx(
        102.5 / rows[0]["predicted_service_p50_ms"])
    assert (out / "sim_sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "rcllm-0.3/0.3 @ affinity" in (out / "sim_sweep.md").read_text()
    (tmp_path / "old.json").write_text(json.dumps({"name": "bench.serve.sweep", "cells": [
        {**cells[0], "requests": [{"status": 200, "instance": 0}]}]}))
    with pytest.raises(Exception, match="context_tokens"):
        served.load_sweep(str(tmp_path / "old.json"))


def test_a_stopped_sweeps_partial_file_is_read(tmp_path):
    """sweep.partial.json (what a stopped sweep leaves) is accepted; one written before it
    carried its name and instance count takes the instances its requests name."""
    reqs = [_request("full", 600, 600, k % 2) for k in range(4)]
    cell = {"rate_rps": 1.0, "series": "full @ load-only", "method": "full",
            "policy": "load-only", "arrivals_s": [0.0, 1.0, 2.0, 3.0], "requests": reqs,
            "ttft_p50_ms": 100.0, "ttft_p99_ms": 200.0, "engine_ttft_p50_ms": 90.0}
    old = tmp_path / "sweep.partial.json"
    old.write_text(json.dumps({"capacity_rps": 2.0, "cells": [cell]}))
    data = served.load_sweep(str(old))
    profile = served.fit_profile(_fit_records(np.random.default_rng(1)))
    rows, _ = served.predict_sweep(data, profile)
    assert len(rows) == 1 and rows[0]["below_capacity"]
    (tmp_path / "other.json").write_text(json.dumps({"cells": [cell]}))   # not a sweep
    with pytest.raises(Exception, match="not a"):
        served.load_sweep(str(tmp_path / "other.json"))


def test_busy_instances_share_the_machine():
    """With a busy slowdown F, two instances computing at once each run at 1/F; one alone
    runs at full speed (so the one left speeds up when the other finishes)."""
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    one = float(predict_ms(profile, "full", np.array([500]), np.array([500]))[0])
    two = float(predict_ms(profile, "full", np.array([1000]), np.array([1000]))[0])
    reqs = [_request("full", 500, 500, 0), _request("full", 1000, 1000, 1)]
    ttft, svc, _ = served.simulate_cell([0, 0], reqs, profile, 2, "affinity", busy_slowdown=2.0)
    # both at half speed until the short one is done at 2·one, then the long one alone
    assert ttft == pytest.approx([2 * one, 2 * one + (two - one)])
    assert svc == pytest.approx([one, two])
    apart, _, _ = served.simulate_cell([0, 100], reqs, profile, 2, "affinity",
                                       busy_slowdown=1.0)   # F = 1: independent instances
    assert apart == pytest.approx([one, two])
    spaced, _, _ = served.simulate_cell([0, 10], [reqs[0], reqs[0]], profile, 2, "affinity",
                                        busy_slowdown=3.0)   # never overlapping: no slowdown
    assert spaced == pytest.approx([one, one])


def test_work_behind_an_answer_shares_the_cores_with_the_next_request():
    """A request's behind_tokens run on its instance's builder thread after its answer: with
    one core the next request shares it until they are done; with two, or with behind work
    left out (cores None), the next request runs at full speed."""
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    one = float(predict_ms(profile, "full", np.array([500]), np.array([500]))[0])
    b = served.behind_ms(profile, 200, 200)
    assert b == pytest.approx(200, rel=0.05)          # compute terms only: no fixed cost
    first = dict(_request("rcllm", 500, 500, 0), behind_tokens=[[200, 200]])
    reqs = [first, _request("rcllm", 500, 500, 0)]
    at = [0, one / 1e3]                               # the second arrives as the first answers
    shared, _, _ = served.simulate_cell(at, reqs, profile, 1, "affinity", cores=1)
    # half speed while the build runs (2b), then alone for what is left (one - b)
    assert shared == pytest.approx([one, one + b], rel=1e-6)
    for cores in (2, None):
        alone, _, _ = served.simulate_cell(at, reqs, profile, 1, "affinity", cores=cores)
        assert alone == pytest.approx([one, one], rel=1e-6)
    # a sweep without behind_tokens is predicted without behind work, and says so
    sweep = {"instances": 1, "capacity_rps": 1.0, "cpu_count": 1, "cells": [
        {"arrivals_s": at, "requests": reqs, "policy": "affinity", "rate_rps": 0.5,
         "series": "s", "method": "rcllm", "ttft_p50_ms": 1.0, "ttft_p99_ms": 1.0,
         "engine_ttft_p50_ms": 1.0}]}
    rows, summary = served.predict_sweep(sweep, profile)
    assert summary["behind_cores"] == 1
    assert rows[0]["behind_ms_per_request"] == pytest.approx(b / 2)
    assert rows[0]["predicted_p99_ms"] > one + 0.9 * b
    del first["behind_tokens"]
    rows, summary = served.predict_sweep(sweep, profile)
    assert summary["behind_cores"] is None and not summary["behind_recorded"]
    assert rows[0]["behind_ms_per_request"] is None
    # a relay's prewarms are not replayed, and the summary says how many were left out
    assert summary["relay_prewarms_left_out"] == 0
    sweep["cells"][0]["prewarms"] = 3
    assert served.predict_sweep(sweep, profile)[1]["relay_prewarms_left_out"] == 3


def test_a_niced_builder_takes_only_its_weight_of_a_shared_core():
    """At the served `reuse.behind_nice` (recorded in the sweep) a builder weighs
    behind_weight(nice) of an engine thread: on one core the next request runs at
    1/(1 + w) of full speed while the build runs, not at half; at nice 0 the same as before."""
    assert served_cluster.core_shares([1.0, 1.0, 1.0], 2) == pytest.approx([2 / 3] * 3)
    assert served_cluster.core_shares([1.0, 0.1], 2) == [1.0, 1.0]
    assert served_cluster.core_shares([1.0, 1.0, 0.1, 0.1], 2) == pytest.approx(
        [2 / 2.2, 2 / 2.2, 0.2 / 2.2, 0.2 / 2.2])
    assert served_cluster.core_shares([1.0, 0.05], 1.5) == pytest.approx([1.0, 0.5])  # capped at a core
    assert served.behind_weight(0) == 1.0 and served.behind_weight(10) == pytest.approx(110 / 1024)
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    one = float(predict_ms(profile, "full", np.array([500]), np.array([500]))[0])
    b = served.behind_ms(profile, 200, 200)
    reqs = [dict(_request("rcllm", 500, 500, 0), behind_tokens=[[200, 200]]),
            _request("rcllm", 500, 500, 0)]
    at = [0, one / 1e3]
    w = served.behind_weight(10)
    assert one < b / w            # the request ends before the niced build has had b of core
    niced, _, _ = served.simulate_cell(at, reqs, profile, 1, "affinity", cores=1,
                                       builder_weight=w)
    even, _, _ = served.simulate_cell(at, reqs, profile, 1, "affinity", cores=1)
    # niced: at 1/(1 + w) of a core the whole time; at nice 0 half a core while the build
    # runs (2b), then alone: b later
    assert niced == pytest.approx([one, one * (1 + w)], rel=1e-6)
    assert even == pytest.approx([one, one + b], rel=1e-6)
    sweep = {"instances": 1, "capacity_rps": 1.0, "cpu_count": 1, "behind_nice": 10,
             "cells": [{"arrivals_s": at, "requests": reqs, "policy": "affinity",
                        "rate_rps": 0.5, "series": "s", "method": "rcllm", "ttft_p50_ms": 1.0,
                        "ttft_p99_ms": 1.0, "engine_ttft_p50_ms": 1.0}]}
    _, summary = served.predict_sweep(sweep, profile)
    assert summary["behind_nice"] == 10 and summary["behind_weight"] == pytest.approx(w)


def test_behind_work_is_priced_by_the_builds_a_bench_run_timed(tmp_path):
    """bench ttft's timed chunk builds give a fixed cost per job plus one per token
    (`fit_behind`); the simulator prices each behind job with it, so a chunk costs its per-call
    overhead too, and `rcllm sim sweep` reads it from the fit file and reports it."""
    import argparse

    rng = np.random.default_rng(3)
    n = rng.integers(10, 40, 30)
    builds = [[int(k), int(k) + 40, 100.0 + 3.0 * k] for k in n]
    cost = served.fit_behind(builds)
    assert cost == pytest.approx((100.0, 3.0), rel=1e-6)
    assert served.fit_behind(builds[:3]) is None
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    assert served.behind_ms(profile, 20, 60, cost) == pytest.approx(160.0)
    one = float(predict_ms(profile, "full", np.array([500]), np.array([500]))[0])
    reqs = [dict(_request("rcllm", 500, 500, 0), behind_tokens=[[20, 60]]),
            _request("rcllm", 500, 500, 0)]
    at = [0, one / 1e3]
    shared, _, _ = served.simulate_cell(at, reqs, profile, 1, "affinity", cores=1,
                                       behind_cost=cost)
    assert shared == pytest.approx([one, one + 160.0], rel=1e-6)
    # the CLI: builds in the fit file's summary price the behind work
    fit = tmp_path / "ttft.json"
    fit.write_text(json.dumps({"summary": {"requests": _fit_records(rng),
                                           "chunk_builds": builds}}))
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"name": "bench.serve.sweep", "instances": 1,
                                 "capacity_rps": 1.0, "cpu_count": 1, "cells": [
        {"arrivals_s": at, "requests": reqs, "policy": "affinity", "rate_rps": 0.5,
         "series": "s", "method": "rcllm", "ttft_p50_ms": 1.0, "ttft_p99_ms": 1.0,
         "engine_ttft_p50_ms": 1.0}]}))
    top = argparse.ArgumentParser()
    register(top.add_subparsers(), argparse.ArgumentParser().add_subparsers())
    args = top.parse_args(["sim", "sweep", "--sweep-json", str(sweep), "--fit-json", str(fit),
                           "--out", str(tmp_path / "out")])
    assert args.func(args) == 0
    report = json.loads((tmp_path / "out" / "sim_sweep.json").read_text())
    assert report["summary"]["behind_cost"] == pytest.approx([100.0, 3.0], rel=1e-6)
    assert report["rows"][0]["behind_ms_per_request"] == pytest.approx(80.0)


def test_busy_slowdown_is_measured_on_two_runs_of_the_same_requests():
    alone = [{"user_id": u, "method": "full", "variant": "full", "ttft_ms": 100.0 + u}
             for u in range(5)]
    shared = [{**r, "ttft_ms": r["ttft_ms"] * f} for r, f in zip(alone, (1.5, 1.6, 1.7, 9, 1))]
    f, n = slowdown.busy_slowdown_from(alone, shared)
    assert (f, n) == ({"full": pytest.approx(1.6), "*": pytest.approx(1.6)}, 5)
    # per engine method: a method slowed more is priced so; an unmeasured one gets "*"
    rcllm = [{**r, "method": "rcllm", "variant": "rcllm 0.3/0.3"} for r in alone]
    f, n = slowdown.busy_slowdown_from(alone + rcllm, shared + [
        {**r, "ttft_ms": r["ttft_ms"] * 2.0} for r in rcllm])
    assert n == 10 and f["rcllm"] == pytest.approx(2.0) and f["full"] == pytest.approx(1.6)
    assert slowdown.slowdown_of(f, "naive") == f["*"] and slowdown.slowdown_of(1.3, "full") == 1.3
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    reqs = [_request("full", 500, 500, 0), _request("rcllm", 500, 150, 1)]
    one = served.service_ms(profile, "full", 500, 500)
    fast = served.service_ms(profile, "rcllm", 150, 500)   # done at 2·fast < one
    ttft, _, _ = served.simulate_cell([0, 0], reqs, profile, 2, "affinity",
                                      busy_slowdown={"full": 1.0, "rcllm": 2.0})
    assert ttft[1] == pytest.approx(2 * fast) and ttft[0] == pytest.approx(one)
    with pytest.raises(Exception, match="share no request"):
        slowdown.busy_slowdown_from(alone, [{**shared[0], "user_id": 99}])


def test_served_overlap_script_splits_requests_by_the_other_instances_work():
    """scripts/served_overlap.py: a request whose whole engine span another instance was
    computing is "busy", one alone is "idle"; its ratios are against the fitted prediction."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "scripts" / "served_overlap.py"
    spec = importlib.util.spec_from_file_location("served_overlap", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    one = float(predict_ms(profile, "full", np.array([500]), np.array([500]))[0])

    def req(instance, sent_s, cpu):
        return {**_request("full", 500, 500, instance), "sent_s": sent_s, "ttft_ms": 2 * one,
                "total_ms": 2 * one, "latency_ms": 2 * one, "thread_cpu_ms": cpu}

    cell = {"series": "full @ load-only", "requests": [
        req(0, 0.0, one), req(1, 0.0, one), req(0, 100.0, 2 * one)]}
    out = mod.rows({"cells": [cell]}, profile)
    assert len(out[("full", "busy")]) == 2 and len(out[("full", "idle")]) == 1
    eng, cpu, share = out[("full", "busy")][0][:3]
    assert eng == pytest.approx(2.0) and cpu == pytest.approx(1.0) and share == pytest.approx(0.5)


def test_each_cell_is_scaled_to_the_machines_speed_by_the_reference_pass(tmp_path):
    """The VM's speed drifts between runs: a cell whose reference pass (timed before it) ran
    10% slower than the fit run's is predicted 10% slower with `--speed-reference`, a cell
    without one is unscaled, and without the flag (the default) nothing is scaled."""
    import argparse

    profile = served.fit_profile(_fit_records(np.random.default_rng(1)))
    reqs = [_request("rcllm", 600, 180, k % 2) for k in range(6)]
    arrivals = (np.arange(6) / 1.0).tolist()
    alone = served.simulate_cell(arrivals, reqs, profile, 2, "affinity")[0]
    cells = []
    for ref in ([110.0, 112.0, 108.0], None):
        cell = {"rate_rps": 1.0, "series": "s", "method": "rcllm", "policy": "affinity",
                "arrivals_s": arrivals, "requests": reqs, "engine_ttft_p50_ms": 1.0,
                "ttft_p50_ms": float(np.percentile(alone * 1.1, 50)),
                "ttft_p99_ms": float(np.percentile(alone * 1.1, 99))}
        cells.append(cell if ref is None else {**cell, "reference_ms": ref})
    assert served.speed_scale(cells[0], 100.0) == pytest.approx(1.1)
    assert served.speed_scale(cells[1], 100.0) == 1.0
    assert served.speed_scale(cells[0], None) == 1.0
    fit = tmp_path / "ttft.json"
    fit.write_text(json.dumps({"summary": {"requests": _fit_records(np.random.default_rng(1)),
                                           "reference_ms": [98.0, 102.0]}}))
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"name": "bench.serve.sweep", "instances": 2,
                                 "capacity_rps": 10.0, "cells": cells}))
    top = argparse.ArgumentParser()
    register(top.add_subparsers(), argparse.ArgumentParser().add_subparsers())
    for extra, errors in ((["--speed-reference"], [0.0, 1 - 1 / 1.1]),
                          ([], [1 - 1 / 1.1, 1 - 1 / 1.1]),
                          (["--no-speed-reference"], [1 - 1 / 1.1, 1 - 1 / 1.1])):
        out = tmp_path / f"out{'-'.join(extra)}"
        args = top.parse_args(["sim", "sweep", "--sweep-json", str(sweep), "--fit-json",
                               str(fit), "--out", str(out)] + extra)
        assert args.func(args) == 0
        report = json.loads((out / "sim_sweep.json").read_text())
        assert [r["p50_rel_err"] for r in report["rows"]] == pytest.approx(errors, abs=1e-6)
        assert report["summary"]["fit_reference_ms"] == (100.0 if extra == ["--speed-reference"]
                                                         else None)
    # a fit run recorded before the reference existed leaves every cell unscaled
    fit.write_text(json.dumps({"summary": {"requests": _fit_records(np.random.default_rng(1))}}))
    assert served.load_fit_extras([str(fit)]) == ([], None)


def _served_cli(tmp_path, cal: dict, sweep: dict, fit) -> tuple:
    """The `sim` command parser and the base of a `sim sweep` command line, with the
    calibration run and the sweep written to tmp_path (cal.json, sweep.json)."""
    import argparse

    paths = {}
    for name, data in (("cal", cal), ("sweep", sweep)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    top = argparse.ArgumentParser()
    register(top.add_subparsers(), argparse.ArgumentParser().add_subparsers())
    return top, ["sim", "sweep", "--sweep-json", str(paths["sweep"]), "--fit-json", str(fit)], \
        str(paths["cal"]), str(paths["sweep"])


def test_served_slowdown_is_the_engine_cpu_of_a_separate_served_run_over_the_profile(tmp_path):
    """--served-from: F per method is the median of a separate served run's engine thread CPU
    over the profile's price of the same tokens (requests without thread_cpu_ms or not
    answered are left out); the sweep being predicted is refused as its own calibration, and
    only one source of F is taken."""
    profile = served.fit_profile(_fit_records(np.random.default_rng(2)))
    price = lambda m, c, x: served.service_ms(profile, m, c, x)  # noqa: E731

    def req(method, comp, f, **kw):
        return {**_request(method, 600, comp, 0), "ttft_ms": 9e9,
                "thread_cpu_ms": f * price(method, comp, 600), **kw}

    cal = {"name": "bench.serve.sweep", "instances": 2, "capacity_rps": 10.0, "start_s": 3.0,
           "cells": [{"rate_rps": 1.0, "series": "s", "method": "rcllm", "policy": "affinity",
                      "arrivals_s": [0.0] * 6, "ttft_p50_ms": 1.0, "ttft_p99_ms": 1.0,
                      "engine_ttft_p50_ms": 1.0,
                      "requests": [req("full", 600, 1.02), req("full", 600, 1.06),
                                   req("full", 600, 1.10), req("rcllm", 180, 1.2),
                                   req("rcllm", 180, 9.0, status=503),
                                   {**req("rcllm", 180, 1.0), "thread_cpu_ms": None}]}]}
    f, n = slowdown.served_slowdown_from(cal, price)
    assert n == 4 and f["full"] == pytest.approx(1.06) and f["rcllm"] == pytest.approx(1.2)
    assert f["*"] == pytest.approx((1.06 + 1.10) / 2)
    f2, _ = slowdown.served_slowdown_from(cal, price, lambda cell: 2.0)
    assert f2["full"] == pytest.approx(0.53)          # priced at the cell's speed scale
    with pytest.raises(Exception, match="thread_cpu_ms"):
        slowdown.served_slowdown_from({"cells": [{"requests": []}]}, price)
    # the CLI: F from the calibration run slows the predicted cell where both instances compute
    fit = tmp_path / "ttft.json"
    fit.write_text(json.dumps({"summary": {"requests": _fit_records(np.random.default_rng(2))}}))
    reqs = [_request("full", 600, 600, k % 2) for k in range(2)]
    one = price("full", 600, 600)
    sweep = {**cal, "start_s": 4.0, "cells": [{**cal["cells"][0], "arrivals_s": [0.0, 0.0],
                                                "requests": reqs, "ttft_p50_ms": one * 1.06,
                                                "ttft_p99_ms": one * 1.06}]}
    top, base, cal_path, sweep_path = _served_cli(tmp_path, cal, sweep, fit)
    args = top.parse_args(base + ["--served-from", cal_path, "--out", str(tmp_path / "out")])
    assert args.func(args) == 0
    report = json.loads((tmp_path / "out" / "sim_sweep.json").read_text())
    assert report["rows"][0]["predicted_p50_ms"] == pytest.approx(one * 1.06)
    assert report["summary"]["busy_slowdown"]["full"] == pytest.approx(1.06)
    for extra, match in ((["--served-from", sweep_path], "being predicted"),
                         (["--served-from", cal_path, "--busy-slowdown", "1.2"],
                          "give one")):
        args = top.parse_args(base + extra + ["--out", str(tmp_path / "bad")])
        with pytest.raises(Exception, match=match):
            args.func(args)



def test_merged_recorded_runs_keep_what_sim_sweep_reads_beside_the_requests(tmp_path):
    """scripts/merge_bench_runs.py: per request and variant the fastest of the runs that all
    measured it (on times scaled by each run's speed reference), user ids replaced, and the runs' timed chunk builds and mean speed reference
    kept for `rcllm sim sweep`; an existing output is never overwritten."""
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).parents[2] / "scripts" / "merge_bench_runs.py"
    runs = []
    for k, ms in enumerate((110.0, 100.0)):
        recs = [{**r, "user_id": f"u{i}", "variant": r["method"], "ttft_ms": r["ttft_ms"] + ms}
                for i, r in enumerate(_fit_records(np.random.default_rng(0))[:3])]
        path = tmp_path / f"run{k}.json"
        path.write_text(json.dumps({"summary": {"requests": recs[:3 - k],
                                                "chunk_builds": [[16, 40, 90.0 + k]],
                                                "reference_ms": [400.0 + 10 * k]}}))
        runs.append(str(path))
    out = tmp_path / "merged.json"
    cmd = [sys.executable, str(script), str(out), *runs, "--min-repeats", "2",
           "--recorded-with", "test", "--machine", "test"]
    subprocess.run(cmd, check=True, capture_output=True)
    data = json.loads(out.read_text())
    assert [r["user_id"] for r in data["requests"]] == ["r0", "r1"]   # u2: measured once
    first = _fit_records(np.random.default_rng(0))[0]["ttft_ms"]
    # run 1 wins (faster on its own machine), stored in the mean reference's units
    assert data["requests"][0]["ttft_measured_ms"] == pytest.approx(first + 100.0)
    assert data["requests"][0]["ttft_ms"] == pytest.approx((first + 100.0) * 405 / 410, abs=0.1)
    assert data["requests"][0]["repeats"] == 2
    assert served.load_fit_extras([str(out)]) == ([[16, 40, 90.0], [16, 40, 91.0]], 405.0)
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "not overwritten" in again.stderr


def test_measured_service_replays_each_requests_own_engine_time():
    """`--service measured`: a request is served for the engine TTFT the sweep measured, so
    spaced requests get exactly it and a burst on one instance queues behind the measured
    times, whatever the profile says (no scaling, no behind work)."""
    profile = served.fit_profile(_fit_records(np.random.default_rng(0)))
    reqs = [{**_request("rcllm", 500, 150, 0), "ttft_ms": ms,
             "behind_tokens": [[64, 110]]} for ms in (300.0, 700.0, 200.0)]
    ttft, svc, _ = served.simulate_cell([0, 10, 20], reqs, profile, 2, "affinity",
                                        measured=True)
    np.testing.assert_allclose(ttft, [300, 700, 200])
    ttft, _, _ = served.simulate_cell([0, 0, 0], reqs, profile, 2, "affinity", measured=True)
    np.testing.assert_allclose(ttft, [300, 1000, 1200])
    sweep = {"instances": 2, "capacity_rps": 10.0, "cells": [{
        "rate_rps": 1.0, "series": "rcllm @ affinity", "method": "rcllm", "policy": "affinity",
        "arrivals_s": [0, 0, 0], "requests": reqs, "ttft_p50_ms": 1000.0,
        "ttft_p99_ms": 1196.0, "engine_ttft_p50_ms": 300.0, "reference_ms": 999.0}]}
    rows, summary = served.predict_sweep(sweep, profile, fit_reference_ms=100.0,
                                         service="measured")
    assert rows[0]["predicted_p50_ms"] == pytest.approx(1000)
    assert rows[0]["speed_scale"] == 1.0 and summary["behind_cores"] is None
    assert summary["service"] == "measured"
    with pytest.raises(Exception, match="service"):
        served.predict_sweep(sweep, profile, service="oracle")


def test_served_wait_script_groups_requests_by_the_builds_beside_them():
    """scripts/served_wait.py: a builder is busy from an answer for its behind work's price, so
    the next request on that instance overlaps its own build and one on the other instance
    overlaps the other's; wait / CPU comes from run_wait_ms over thread_cpu_ms."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "scripts" / "served_wait.py"
    spec = importlib.util.spec_from_file_location("served_wait", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def req(instance, sent_s, wait, behind=()):
        return {**_request("rcllm", 500, 150, instance), "sent_s": sent_s, "ttft_ms": 100.0,
                "total_ms": 100.0, "latency_ms": 100.0, "thread_cpu_ms": 100.0,
                "run_wait_ms": wait, "behind_tokens": list(behind)}

    cell = {"requests": [
        req(0, 0.0, 2.0, [[10, 20]]),   # answered at 100 ms; its build 100–160 ms
        req(0, 0.1, 15.0),              # engine 100–200 ms beside its own build
        req(1, 0.1, 12.0)]}             # engine 100–200 ms beside the other's
    out = mod.rows({"cells": [cell]}, (50.0, 1.0))
    assert out[:, 0] == pytest.approx([0.02, 0.15, 0.12])
    assert out[1, 1:] == pytest.approx([1.0, 0.6, 0.0])
    assert out[2, 1:] == pytest.approx([1.0, 0.0, 0.6])
    assert out[0, 1:] == pytest.approx([0.0, 0.0, 0.0])


def test_builder_weight_is_measured_on_a_separate_served_run(tmp_path):
    """--served-weight: the builders' CPU weight is the one at which the simulator, replaying
    the --served-from run, gives the engine time that run measured; a run whose engine times
    were made by the simulator at weight 0.3 gives back 0.3. The bounds when outside, a run
    with no work behind its answers refused, and the CLI uses the weight it measured."""
    profile = served.fit_profile(_fit_records(np.random.default_rng(3)))
    reqs = [dict(_request("rcllm", 500 + 40 * k, 300, k % 2), behind_tokens=[[120, 120]])
            for k in range(8)]
    at = [0.1 * k for k in range(8)]
    cell = {"rate_rps": 1.0, "series": "s", "method": "rcllm", "policy": "affinity",
            "arrivals_s": at, "requests": reqs, "ttft_p50_ms": 1.0, "ttft_p99_ms": 1.0,
            "engine_ttft_p50_ms": 1.0}

    def engine_ms(c, w):
        return served.simulate_engine(c["arrivals_s"], c["requests"], profile, 2, "affinity",
                                      cores=2, builder_weight=w)[3]

    alone = engine_ms(cell, 1e-3)
    made = engine_ms(cell, 0.3)
    assert made.sum() > alone.sum()               # the weight matters on this cell
    for r, ms in zip(reqs, made):
        r["ttft_ms"] = float(ms)
    cal = {"name": "bench.serve.sweep", "instances": 2, "cpu_count": 2, "capacity_rps": 10.0,
           "start_s": 5.0, "behind_nice": 10, "cells": [cell]}
    w, n = slowdown.served_builder_weight(cal, engine_ms)
    assert n == 8 and w == pytest.approx(0.3, abs=1e-3)
    slow = {**cal, "cells": [{**cell, "requests": [{**r, "ttft_ms": 1e6} for r in reqs]}]}
    fast = {**cal, "cells": [{**cell, "requests": [{**r, "ttft_ms": 1.0} for r in reqs]}]}
    assert slowdown.served_builder_weight(slow, engine_ms)[0] == 1.0
    assert slowdown.served_builder_weight(fast, engine_ms)[0] == 1e-3
    bare = {**cal, "cells": [{**cell, "requests": [{k: v for k, v in r.items()
                                                    if k != "behind_tokens"} for r in reqs]}]}
    with pytest.raises(Exception, match="behind"):
        slowdown.served_builder_weight(bare, engine_ms)
    # the CLI: the weight measured on the calibration run replaces CFS's
    fit = tmp_path / "ttft.json"
    fit.write_text(json.dumps({"summary": {"requests": _fit_records(np.random.default_rng(3))}}))
    for r in reqs:
        r["thread_cpu_ms"] = served.service_ms(profile, "rcllm", 300, r["context_tokens"])
    sweep = {**cal, "start_s": 6.0, "cells": [{**cell, "arrivals_s": [0.0, 0.1]}]}
    top, base, cal_path, _ = _served_cli(tmp_path, cal, sweep, fit)
    base += ["--out", str(tmp_path / "out")]
    args = top.parse_args(base + ["--served-from", cal_path, "--served-weight"])
    assert args.func(args) == 0
    summary = json.loads((tmp_path / "out" / "sim_sweep.json").read_text())["summary"]
    assert summary["behind_weight_source"] == "served"
    assert summary["behind_weight"] == pytest.approx(0.3, abs=1e-3)   # not CFS's 0.107
    args = top.parse_args(base + ["--served-weight"])
    with pytest.raises(Exception, match="give --served-from"):
        args.func(args)
