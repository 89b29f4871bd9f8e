"""`rcllm sim sweep --routing caches` with the pictures beyond item KV (sim/served_pictures.py):
prefix-aware over the replay's prefix index, user-side over its user sides (a relay's prewarms
and the rankings that read them), and the refusal of a policy whose picture it lacks. Each
request's service is priced as its computed tokens (1 ms a token), so the service says what it
found."""

from __future__ import annotations

import inspect

import pytest

from rcllm.errors import RcllmError
from rcllm.routing import cpu_smollm2_profile
from rcllm.sim import served_cache, served_pictures

PROFILE = cpu_smollm2_profile()
KV = PROFILE.model.kv_bytes_per_token
INSTR = 50          # the instruction's tokens every prefix cache holds


def _sweep(cells, scorer=None):
    tokens = {i: 10 for i in "abcdef"}
    return {"name": "bench.serve.sweep", "redis_tier": False, "instances": 2,
            "config": {"overrides": [], "profile": "calibrate", "scorer": scorer},
            "placement": {"placed": [["a", "b"], ["c", "d"]]}, "item_tokens": tokens,
            "capacity_rps": 100.0, "warm_requests": [], "trace": {"requests": 0},
            "affinity_idle_weight": None, "prefix_instruction_tokens": INSTR,
            "series": [], "cells": cells}


def _row(method, user, items, hist):
    """A served row: 100 tokens of template, 10 per item, 20 per review."""
    return {"status": 200, "method": method, "user": user, "items": list(items),
            "history_items": list(hist), "history_tokens": 20 * len(hist),
            "item_tokens": 10 * len(items),
            "context_tokens": 100 + 10 * len(items) + 20 * len(hist)}


def _cell(method, policy, rows, relay_lead_s=None, gap_s=10.0):
    cell = {"policy": policy, "method": method, "series": f"{method} @ {policy}",
            "rate_rps": 1 / gap_s, "arrivals_s": [gap_s * i for i in range(len(rows))],
            "requests": rows, "relay_lead_s": relay_lead_s}
    if relay_lead_s is not None:
        cell["prewarm_requests"] = [{"status": 200, "user": r["user"]} for r in rows]
    return cell


def _replay(sweep):
    return served_cache.CacheReplay(sweep, PROFILE, lambda m, n, ctx: float(n),
                                    lambda n: 0.0)


def _prefix_rows():
    """u1, u2, u3 new; then u1 returns with one more review: its first two reviews are the
    chain instance 0 holds (listwise: the history entries, then the candidates)."""
    return [_row("prefix", "u1", "ab", ["h1", "h2"]), _row("prefix", "u2", "c", ["h3"]),
            _row("prefix", "u3", "e", ["h5"]), _row("prefix", "u1", "d", ["h1", "h2", "h4"])]


def test_prefix_aware_sends_a_returning_user_to_its_prefix_and_prices_the_hit():
    replay = _replay(_sweep([_cell("prefix", "prefix-aware", _prefix_rows())]))
    ttft, svc, hits = replay.cell(replay.sweep["cells"][0])
    # load-only's rotation puts u1, u2, u3 on 0, 1, 0 (all computed past the instruction);
    # u1's return would rotate to 1, but instance 0 holds 2 of its 3 reviews: 40 tokens
    assert list(svc) == [160 - INSTR, 130 - INSTR, 130 - INSTR, 170 - INSTR - 40]
    assert hits["prefix_hit_ratio"] == pytest.approx(40 / (110 + 80 + 80 + 120))
    assert hits["prefix_hit_requests"] == pytest.approx(0.25)
    # prefix caching looks no chunk up
    assert hits["chunk_hit_ratio"] is None
    # the chains are on the instances that answered them, in the router's estimated tokens
    # (60 a review, an item's count), under serve's capacity rule
    index = replay.pictures.prefixes
    assert index.capacity_tokens == served_pictures.PREFIX_CACHE_BYTES // KV
    assert index.held_tokens(0) == (2 * 60 + 2 * 10) + (60 + 10) + 60 + 10   # u1's new tail
    assert index.held_tokens(1) == 60 + 10


def test_the_load_only_control_finds_no_prefix_beyond_the_instruction():
    replay = _replay(_sweep([_cell("prefix", "load-only", _prefix_rows())]))
    _ttft, svc, hits = replay.cell(replay.sweep["cells"][0])
    assert svc[3] == 170 - INSTR                  # rotated to instance 1: nothing held there
    assert hits["prefix_hit_ratio"] == 0.0 and hits["prefix_hit_requests"] == 0.0


def test_the_next_cell_is_redated_so_its_chains_match_nothing_of_the_last():
    cells = [_cell("prefix", "prefix-aware", _prefix_rows()[:1]),
             _cell("prefix", "prefix-aware", _prefix_rows()[:1])]
    replay = _replay(_sweep(cells))
    replay.cell(cells[0])
    _ttft, svc, hits = replay.cell(cells[1])
    assert svc[0] == 160 - INSTR and hits["prefix_hit_ratio"] == 0.0


def _user_rows():
    return [_row("exact-user", "u1", "a", ["h1", "h2"]),
            _row("exact-user", "u2", "c", ["h3"]),
            _row("exact-user", "u1", "b", ["h1", "h2", "h6"])]


def test_user_side_follows_a_relays_prewarm_and_reuses_the_side():
    replay = _replay(_sweep([_cell("exact-user", "user-side", _user_rows(), 1.0)],
                            "pointwise"))
    _ttft, svc, hits = replay.cell(replay.sweep["cells"][0])
    # each prewarm (1 s ahead) goes by load where no side is (0, then 1) or to the side it
    # extends (u1's, on 0); each ranking follows it: the instruction and reviews reused
    assert list(svc) == [150 - INSTR - 40, 130 - INSTR - 20, 170 - INSTR - 60]
    assert hits["user_prefix_hit_ratio"] == 1.0 and hits["user_prefix_append_ratio"] == 0.0
    assert hits["chunk_hit_ratio"] is None        # nothing left to look up: items computed
    assert replay.pictures.homes["u1"][0] == 0 and replay.pictures.homes["u2"][0] == 1


def test_load_only_under_a_relay_misses_the_prewarmed_sides():
    replay = _replay(_sweep([_cell("exact-user", "load-only", _user_rows(), 1.0)],
                            "pointwise"))
    _ttft, svc, hits = replay.cell(replay.sweep["cells"][0])
    # prewarms and rankings share the rotation: every prewarm on 0, every ranking on 1
    assert list(svc) == [150 - INSTR, 130 - INSTR, 170 - INSTR]
    assert hits["user_prefix_hit_ratio"] == 0.0
    # a miss looks its history chunks up (2 + 1 + 3): u1's first two were built on 1 by its
    # first ranking (found, but computed all the same: late@0)
    assert hits["chunk_hit_ratio"] == pytest.approx(2 / 6)


def test_without_a_relay_a_returning_user_goes_where_it_last_ranked_and_appends():
    replay = _replay(_sweep([_cell("exact-user", "user-side", _user_rows())], "pointwise"))
    _ttft, svc, hits = replay.cell(replay.sweep["cells"][0])
    # u1 on 0 and u2 on 1 by load (misses); u1 returns to 0, its side 2 of its 3 reviews
    assert list(svc) == [150 - INSTR, 130 - INSTR, 170 - INSTR - 40]
    assert hits["user_prefix_hit_ratio"] == 0.0
    assert hits["user_prefix_append_ratio"] == pytest.approx(1 / 3)


def test_a_policy_without_its_picture_is_refused():
    rows = _prefix_rows()[:1]
    with pytest.raises(RcllmError, match="made-up.*--routing replay or policy"):
        _replay(_sweep([_cell("prefix", "prefix-aware", rows), _cell("prefix", "made-up",
                                                                     rows)]))
    # user sides need the pointwise scorer's user-prefix cache
    with pytest.raises(RcllmError, match="user-side.*pointwise"):
        _replay(_sweep([_cell("exact-user", "user-side", rows)]))
    # engines that insert no prompts leave the router no prefix picture
    sweep = _sweep([_cell("prefix", "prefix-aware", rows)])
    sweep["config"]["overrides"] = ["reuse.prefix_insert=false"]
    with pytest.raises(RcllmError, match="prefix_insert"):
        _replay(sweep)


def test_the_prefix_capacity_is_the_engines_prefix_cache_default():
    from rcllm.prefill.prefix_cache import PrefixCache

    default = inspect.signature(PrefixCache).parameters["capacity_bytes"].default
    assert served_pictures.PREFIX_CACHE_BYTES == default


def test_the_sim_sweep_rows_carry_the_prefix_figures_beside_the_measured():
    from rcllm.sim import served

    cell = {**_cell("prefix", "prefix-aware", _prefix_rows()), "ttft_p50_ms": 100.0,
            "ttft_p99_ms": 100.0, "engine_ttft_p50_ms": 90.0, "prefix_hit_ratio": 0.2}
    rows, _summary = served.predict_sweep(_sweep([cell]), PROFILE, routing="caches")
    assert rows[0]["measured_prefix_hit_ratio"] == 0.2
    assert rows[0]["predicted_prefix_hit_ratio"] == pytest.approx(40 / 390)
