"""scripts/frontier.py puts exact-user, the lossless peer of a cached user side, on the
frontier at Δ 0 and gives every path's cached speed over it."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "frontier.py"


@pytest.fixture(scope="module")
def frontier():
    spec = importlib.util.spec_from_file_location("frontier", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _q(variant, delta):
    return {"variant": variant, "ndcg@10": 0.5 + delta, "ndcg@10_delta_vs_full": delta,
            "ndcg@10_delta_vs_full_ci_low": delta - 0.01,
            "ndcg@10_delta_vs_full_ci_high": delta + 0.01}


def test_exact_user_is_a_point_at_delta_0_and_the_divisor(frontier, tmp_path):
    quality = {"late@5": _q("late", -0.01), "naive": _q("naive", -0.2)}
    speed = {"late@5": {"speedup_vs_full": 1.5}, "late@5 +user prefix": {"speedup_vs_full": 1.6},
             "naive +user prefix": {"speedup_vs_full": 6.4},
             "exact-user": {"speedup_vs_full": 1.6}}
    rows = {r["method"]: r for r in frontier.table(quality, speed)}
    assert rows["exact-user"]["delta"] == 0.0 and rows["exact-user"]["speedup_hit"] == 1.6
    assert rows["late@5"]["vs_exact_user"] == pytest.approx(1.0)
    assert rows["naive"]["vs_exact_user"] == pytest.approx(4.0)
    md = frontier.markdown(list(rows.values()))
    assert "cached × exact-user" in md and "| exact-user |" in md
    frontier.plot(list(rows.values()), "toy", str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").stat().st_size > 0


def test_without_the_peer_no_ratio_is_made_up(frontier):
    rows = frontier.table({"naive": _q("naive", -0.2)},
                          {"naive +user prefix": {"speedup_vs_full": 6.4}})
    assert [r["method"] for r in rows] == ["naive"] and rows[0]["vs_exact_user"] is None
