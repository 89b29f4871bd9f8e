import math

import numpy as np
import pytest

from rcllm.errors import RcllmError
from rcllm.routing import CostModel, MethodConfig, RequestShape
from rcllm.routing.vidur_fit import builtin_profile

SHAPE = RequestShape(prefix_tokens=200, fresh_tokens=60, history_tokens=500,
                     history_hit_tokens=450, item_tokens=2000)


@pytest.fixture(scope="module")
def a100():
    return builtin_profile("qwen3-8b@a100")


def test_service_grows_with_computed_tokens_and_context(a100):
    cost = CostModel(a100, MethodConfig("full"))
    small = [cost.service_ms(cost.work(RequestShape(0, n, 0, 0, 0), 0)) for n in (100, 1000, 4000)]
    assert small[0] < small[1] < small[2]
    # attention makes it super-linear: 4000 tokens cost more than 4x 1000 tokens
    assert small[2] - a100.fixed_ms > 4 * (small[1] - a100.fixed_ms)


def test_methods_order_and_local_items_help(a100):
    ttft = {m: CostModel(a100, MethodConfig(m)).ttft_ms(SHAPE, 2000.0, 0.0)
            for m in ("full", "prefix", "rcllm")}
    assert ttft["rcllm"] < ttft["prefix"] < ttft["full"]
    rc = CostModel(a100, MethodConfig("rcllm"))
    by_local = rc.ttft_ms(SHAPE, np.array([0.0, 500.0, 1000.0, 2000.0]), 0.0)
    assert np.all(np.diff(by_local) < 0)


def test_ttft_monotone_in_ratio_and_wait(a100):
    vals = [CostModel(a100, MethodConfig("rcllm", r, r)).ttft_ms(SHAPE, 2000.0, 0.0)
            for r in (0.0, 0.3, 0.6, 1.0)]
    assert all(a < b for a, b in zip(vals, vals[1:]))
    rc = CostModel(a100, MethodConfig("rcllm"))
    waits = rc.ttft_ms(SHAPE, 2000.0, np.array([0.0, 10.0, 100.0]))
    assert np.allclose(np.diff(waits), [10.0, 90.0])


def test_full_budget_recomputes_every_token(a100):
    work = CostModel(a100, MethodConfig("rcllm", 1.0, 1.0)).work(SHAPE, 2000.0)
    assert work.computed_tokens == pytest.approx(SHAPE.context_tokens)


def test_transfer_hidden_by_overlap_and_remote_fetch(a100):
    rc = CostModel(a100, MethodConfig("rcllm"))
    work = rc.work(SHAPE, 2000.0)
    assert rc.transfer_ms(work) > 0
    assert rc.service_ms(work) == pytest.approx(rc.prefill_ms(work))  # fully overlapped
    no_overlap = CostModel(a100.replace(overlap_fraction=0.0), MethodConfig("rcllm"))
    assert no_overlap.service_ms(work) == pytest.approx(rc.prefill_ms(work) + rc.transfer_ms(work))
    fetch = CostModel(a100, MethodConfig("rcllm", remote_items="fetch"))
    w = fetch.work(SHAPE, 0.0)
    assert w.network_bytes == 2000 * a100.model.kv_bytes_per_token
    assert fetch.ttft_ms(SHAPE, 0.0, 0.0) < rc.ttft_ms(SHAPE, 0.0, 0.0)


def test_model_shapes():
    p = builtin_profile("qwen3-8b@a100")
    assert p.model.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    params = p.model.linear_params_per_layer * p.model.num_layers
    assert 6.5e9 < params < 7.5e9  # Qwen3-8B without embeddings
    assert math.isfinite(p.full_prefill_ms(2048)) and 100 < p.full_prefill_ms(2048) < 300


@pytest.mark.parametrize("kwargs", [{"method": "magic"}, {"item_ratio": 1.5},
                                    {"remote_items": "teleport"}])
def test_method_config_validates(kwargs):
    with pytest.raises(RcllmError):
        MethodConfig(**kwargs)


def test_a_request_is_priced_at_the_budgets_it_names(a100):
    """A request naming its own ratios (a /v1/rank payload's) is priced at them, not at the
    model's method config: the router prices rcllm 0.15/0.15 as what it computes."""
    from dataclasses import replace

    from rcllm.routing.requests import routing_request

    model = CostModel(a100, MethodConfig("rcllm", 0.3, 0.3))
    own = replace(SHAPE, item_ratio=0.15, history_ratio=0.15)
    assert model.ttft_ms(own, 2000.0, 0.0) == CostModel(
        a100, MethodConfig("rcllm", 0.15, 0.15)).ttft_ms(SHAPE, 2000.0, 0.0)
    assert model.ttft_ms(own, 2000.0, 0.0) < model.ttft_ms(SHAPE, 2000.0, 0.0)
    payload = {"user_id": "u", "history": [{"item_id": "h"}], "candidates": ["a", "b"],
               "item_ratio": 0.15, "history_ratio": 0.1}
    for user_side in (False, True):
        shape = routing_request(payload, {"a": 30, "b": 30}, user_side).shape
        assert (shape.item_ratio, shape.history_ratio) == (0.15, 0.1)
    bare = routing_request({**payload, "item_ratio": None, "history_ratio": None}, {}).shape
    assert (bare.item_ratio, bare.history_ratio) == (None, None)
