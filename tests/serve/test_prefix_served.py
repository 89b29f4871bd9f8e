"""Prefix caching as deployed in the served sweep (issue 60 item 2), without Ray: the router's
picture takes the prompts its instances insert, a cell's prefix-cache hit ratio counts only
hits beyond the instruction's blocks, and the trace says how often a returning user's history
grew as a prefix."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.loadgen import series as sw
from rcllm.loadgen.cells import cell_metrics, prefix_metrics
from rcllm.loadgen.trace import Trace
from rcllm.routing import cpu_smollm2_profile
from rcllm.routing.prefixes import PrefixIndex
from rcllm.serve.picture import Picture
from rcllm.serve.views import live_instances, routing_request

HISTORY = [{"item_id": f"h{k}", "rating": 4, "review": "", "timestamp": k} for k in range(5)]


def _row(prefix_tokens, context_tokens=500):
    return {"status": 200, "latency_ms": 10.0, "ttft_ms": 8.0, "total_ms": 9.0, "hits": 0,
            "lookups": 0, "instance": 0, "prefix_tokens": prefix_tokens,
            "context_tokens": context_tokens}


def test_the_hit_ratio_counts_only_hits_beyond_the_instruction():
    # the instruction's 96 tokens hit on every request: alone they are no hit
    rows = [_row(96), _row(96), _row(96 + 160), _row(0)]
    m = prefix_metrics(rows, instruction_tokens=96)
    assert m["prefix_hit_ratio"] == pytest.approx(160 / (3 * (500 - 96) + 404))
    assert m["prefix_hit_requests"] == pytest.approx(1 / 4)
    assert prefix_metrics([_row(96)], 96) == {"prefix_hit_ratio": 0.0,
                                              "prefix_hit_requests": 0.0}
    # unknown instruction, or rows recorded before they carried prefix_tokens: no ratio
    assert prefix_metrics(rows, None)["prefix_hit_ratio"] is None
    old = [{k: v for k, v in _row(96).items() if k != "prefix_tokens"}]
    assert cell_metrics(old, 1.0, 5000, 96)["prefix_hit_ratio"] is None
    assert cell_metrics(rows, 1.0, 5000, 96)["prefix_hit_requests"] == pytest.approx(0.25)


def test_the_picture_takes_the_prompts_its_instances_insert():
    instances = live_instances([[], []])
    pic = Picture(instances, cpu_smollm2_profile(), None, None, PrefixIndex(2, 100_000))
    payload = {"user_id": "u", "history": HISTORY[:3], "candidates": ["a"]}
    req = routing_request(payload, {"a": 30}, False, 10)
    pic.prompt_served(instances[1], req, {"method": "rcllm"})    # reads no prefix cache
    assert pic.view(instances, payload).prefixes.matched_tokens(
        req.prefix, req.prefix_tokens).max() == 0
    pic.prompt_served(instances[1], req, {"method": "prefix"})
    grown = routing_request({**payload, "history": HISTORY}, {"a": 30}, False, 10)
    view = pic.view(instances, {**payload, "history": HISTORY})
    assert view.prefixes.matched_tokens(grown.prefix, grown.prefix_tokens).tolist() == [0, 180]
    pic.forget(1)
    assert view.prefixes.matched_tokens(grown.prefix, grown.prefix_tokens).max() == 0


def test_the_prefix_series_is_routed_prefix_aware_with_a_load_only_control():
    out = sw.series_of(sw.DEFAULT_METHODS, "", adapter=False)
    assert [(s.name, s.policy, s.body({})) for s in out[:3]] == [
        ("full", "load-only", {"method": "full"}),
        ("prefix", "prefix-aware", {"method": "prefix"}),
        ("prefix@load-only", "load-only", {"method": "prefix"})]
    assert "prefix-aware" not in sw.DEFAULT_POLICIES.split(",")


def test_the_trace_says_how_often_a_returning_user_s_history_grew():
    def body(user, n, start=0):
        return {"user_id": user, "candidates": ["a", "b"], "history": HISTORY[start:n]}

    bodies = [body("u", 2), body("v", 3), body("u", 4),      # u grew
              body("v", 2),                                  # v came back shorter: shared
              body("u", 5, start=1)]                         # u's window slid: neither
    t = Trace(bodies, np.arange(5.0), [b["user_id"] for b in bodies], 1.0)
    s = t.summary()
    assert (s["repeat_requests"], s["history_extends"], s["history_prefix_shared"]) == (3, 1, 2)
