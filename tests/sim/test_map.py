"""`rcllm sim map` (sim/map.py, map_caches.py, map_report.py): small grids end to end, the
stores' LRU rule, a cache-friendly cell, the band, and options refused before any work."""

import json

import numpy as np
import pytest

from rcllm.cli import main
from rcllm.config import load
from rcllm.errors import RcllmError
from rcllm.routing.views import ArrayLocality
from rcllm.sim.map import MapSpec, path_cost_model, path_costs, run_map
from rcllm.sim.map_caches import ItemCaches
from rcllm.sim.map_report import gains, headline

SMALL = ["items=3000", "requests=150", "warmup=50", "tails=t=1.2", "instances=2,4",
         "budgets=1/16,1/64", "paths=overlap@0.15", "user_sides=miss", "band_instances=4"]


def spec(*extra: str) -> MapSpec:
    return load(MapSpec, None, SMALL + list(extra))


def test_the_json_has_every_cell_and_policy_and_the_png_is_written(tmp_path):
    out = tmp_path / "m"
    assert main(["sim", "map", "--out", str(out), *sum((["--set", s] for s in SMALL), [])]) == 0
    report = json.loads((out / "map.json").read_text())
    assert report["name"] == "sim.map"
    cells = {(r["instances"], r["placement"], r["budget"], r["policy"]) for r in report["rows"]}
    assert cells == {(k, p, b, pol) for k in (2, 4) for p in ("metis", "random")
                     for b in ("1/16", "1/64") for pol in ("load-only", "affinity", "cost")}
    assert len(report["summary"]["gains"]) == 8 and report["summary"]["headline"]["cells"] == 8
    band = report["summary"]["band"]
    assert {(r["budget"], r["policy"]) for r in band} == {
        (b, p) for b in ("1/16", "1/64") for p in ("load-only", "affinity", "cost")}
    assert all(r["instances"] == 4 and r["placement"] == "metis" for r in band)
    assert (out / "map.png").stat().st_size > 5000
    assert "| overlap@0.15 | miss | 2 |" in (out / "map.md").read_text()


def test_a_cache_friendly_cell_gives_cache_aware_routing_more_hits_than_load_only():
    # a tiny budget and expensive misses (naive: a miss is a whole item's compute)
    result = run_map(spec("instances=4", "budgets=1/64", "paths=naive",
                          "placements=metis"), progress=False)
    hit = {r["policy"]: r["item_hit"] for r in result["rows"]}
    assert hit["affinity"] > hit["load-only"] + 0.05
    assert hit["cost"] > hit["load-only"] + 0.05
    cell = gains(result["rows"])[0]
    assert cell["best_hit"] > cell["load_only_hit"]
    rates = {r["rate_rps"] for r in result["rows"]}
    assert len(rates) == 1            # every policy at the same rate


def test_rate_sits_below_load_only_capacity_and_the_band_compares_at_prefix_rate():
    result = run_map(spec("instances=4", "budgets=1/16", "placements=metis"), progress=False)
    lo = next(r for r in result["rows"] if r["policy"] == "load-only")
    # load 0.8 of the capacity load-only's own service gives
    assert lo["rate_rps"] * lo["mean_service_ms"] / 1000 / 4 == pytest.approx(0.8, abs=0.12)
    for r in result["band"]:
        assert r["p99_speedup"] == pytest.approx(r["prefix_p99_ms"] / r["rcllm_p99_ms"])
    head = headline(result["rows"], result["band"])
    assert head["band_cells"] == 1 and head["metis_cells"] == 0


def test_path_prices_follow_the_documented_speedups():
    base, per_token = path_costs("overlap@0.15", "miss", 16.0)
    assert base == pytest.approx(1106 / 2.84) and per_token * 16 == pytest.approx(27.54)
    late_base, late_tok = path_costs("late@5", "cached", 16.0)
    assert late_tok < per_token / 4 and late_base > base
    cost = path_cost_model(base, per_token)
    from rcllm.routing.cost import RequestShape
    shape = RequestShape(0, 0, 0, 0, 320)
    assert float(cost.service_ms(cost.work(shape, 320))) == pytest.approx(base)
    assert float(cost.service_ms(cost.work(shape, 304))) == pytest.approx(base + 16 * per_token)


def test_stores_keep_their_budget_and_drop_the_least_recent():
    tokens = np.full(100, 10)
    loc = ArrayLocality(np.zeros(100, bool), np.arange(100) % 2, 2)
    caches = ItemCaches.from_placement(loc, np.arange(100)[::-1], tokens, 200.0)
    assert caches.held[0].sum() == 20 and caches.held[0, ::2].sum() == 20   # its own shard
    caches.check_invariants()
    for step in range(30):
        caches.use(0, np.array([50 + step]))
        caches.check_invariants()
    assert caches.held[0, 50:80].sum() >= 18          # the recent ones stay
    assert not caches.held[0, 38]                     # the least popular of the shard is gone
    steady = ItemCaches.steady(np.array([[1, 2], [3, 1]]), tokens, 25.0, 3)
    assert steady.held.shape == (3, 100) and steady.held[:, [1, 3]].all()
    assert not steady.held[:, 2].any()


@pytest.mark.parametrize("setting, message", [
    ("instances=2,x", "integers"), ("budgets=0", "within"), ("policies=affinity", "load-only"),
    ("policies=load-only,prefix-aware", "prefixes"), ("policies=load-only,user-side", "user"),
    ("policies=load-only,nope", "unknown"),
    ("paths=late@7", "unknown paths"), ("placements=hash", "unknown placements"),
    ("load=1.2", "load"), ("tails=1.2", "name=alpha"), ("user_sides=", "empty")])
def test_bad_options_fail_clearly_before_any_work(tmp_path, capsys, setting, message):
    out = tmp_path / "never"
    assert main(["sim", "map", "--out", str(out), "--set", setting]) != 0
    assert message in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(RcllmError):
        load(MapSpec, None, [setting])
