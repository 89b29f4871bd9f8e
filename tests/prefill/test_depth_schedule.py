"""rcllm's budgets that shrink with depth (`reuse.depth_decay`) and its window-only probe:
exact at a 1.0 budget, the budget of every layer, the drop order, and FLOPs that count what
each layer computed."""

import pytest
import torch

from rcllm.config import ReuseConfig
from rcllm.prefill.selection import ITEM, Probe, selection_policy
from rcllm.prefill.selective import PrefillInputs, prefill
from tiny_models import tiny_transformer

N, FRESH_HEAD, FRESH_TAIL, CHUNK = 120, 8, 8, 16


@pytest.fixture(scope="module")
def model():
    return tiny_transformer("llama", layers=6)[1]


@pytest.fixture(scope="module")
def exact(model):
    ids = torch.randint(0, 1000, (N,), generator=torch.Generator().manual_seed(0))
    return ids, model.forward(ids, return_kv=True)


def _inputs(model, exact, noise: float = 0.3) -> PrefillInputs:
    """Slots [8, N-8) reuse 16-token item chunks whose cached KV is off by noise at layers
    >= 1 (layer-0 K/V depend on the token alone); the rest are fresh. Fresh buffers each call
    (the prefill writes into them)."""
    ids, out = exact
    g = torch.Generator().manual_seed(1)
    have = torch.zeros(N, dtype=torch.bool)
    have[FRESH_HEAD:N - FRESH_TAIL] = True
    k, v = out["k"].clone(), out["v"].clone()
    for buf in (k, v):
        buf[1:, :, have] += noise * torch.randn(buf[1:, :, have].shape, generator=g)
    offset = torch.where(have, (torch.arange(N) - FRESH_HEAD) % CHUNK, 0)
    return PrefillInputs(ids, k, v, have, torch.zeros(N, dtype=torch.bool),
                         torch.full((N,), ITEM, dtype=torch.int8), offset)


def _run(model, exact, **reuse):
    cfg = ReuseConfig(**{"method": "rcllm", "history_ratio": 0.0, **reuse})
    return prefill(model, _inputs(model, exact), selection_policy(cfg))


def test_full_budget_with_depth_decay_is_full_recompute(model, exact):
    res = _run(model, exact, item_ratio=1.0, depth_decay=2.0)
    assert res.layer_tokens == (N,) * (model.arch.num_layers - 1)
    got, want = model.logits(res.hidden_last), exact[1]["logits"]
    assert (got - want).abs().max().item() < 1e-3


@pytest.mark.parametrize("ratio,decay", [(0.5, 1.0), (0.3, 0.35)])
def test_every_layer_recomputes_its_budget(model, exact, ratio, decay):
    res = _run(model, exact, item_ratio=ratio, depth_decay=decay)
    reused, fresh = N - FRESH_HEAD - FRESH_TAIL, FRESH_HEAD + FRESH_TAIL
    layers = model.arch.num_layers
    depth = [(l - 1) / (layers - 2) for l in range(1, layers)]
    want = tuple(fresh + round(ratio ** (1 + decay * t) * reused) for t in depth)
    assert res.layer_tokens == want
    assert list(want) == sorted(want, reverse=True) and want[-1] < want[0]
    flat = _run(model, exact, item_ratio=ratio, depth_decay=0.0)
    assert flat.layer_tokens == (want[0],) * (layers - 1)
    assert torch.equal(res.computed, flat.computed)  # layer 1 is the flat selection
    assert res.full_flops == flat.full_flops and res.flops < flat.flops


def test_later_layers_keep_the_tokens_the_probe_scored_highest(model, exact):
    inp = _inputs(model, exact)
    policy = selection_policy(ReuseConfig(method="rcllm", item_ratio=0.5, history_ratio=0.0,
                                          depth_decay=1.0, attention_weight=0.0))
    idx = torch.arange(N)
    deviation = torch.rand(N, generator=torch.Generator().manual_seed(2))
    deviation[~inp.have_kv] = 0.0
    keep = policy.layer_set(inp, 1.0, idx, Probe(deviation, torch.ones(N), None))
    budget = round(0.25 * int(inp.have_kv.sum()))
    assert bool(keep[~inp.have_kv].all())  # fresh slots have no KV to fall back on
    kept = deviation[keep & inp.have_kv]
    assert len(kept) == budget
    assert kept.min() >= deviation[~keep].max()


def test_window_budget_probes_window_tokens_only(model, exact):
    # 0.1 of 104 reused tokens (10) fits in the 7 chunks' 4-token windows (28): only they and
    # the fresh tokens run layer 0; a budget beyond the windows probes every reused token
    small = _run(model, exact, item_ratio=0.1, window=4)
    windows = int(((torch.arange(N - 16)) % CHUNK < 4).sum())
    assert small.layer0_computed == FRESH_HEAD + FRESH_TAIL + windows
    assert small.layer_tokens[0] == FRESH_HEAD + FRESH_TAIL + round(0.1 * (N - 16))
    large = _run(model, exact, item_ratio=0.5, window=4)
    assert large.layer0_computed == N


def test_flops_of_a_full_recompute_are_the_full_flops(model, exact):
    ids, _ = exact
    a = model.arch
    k = torch.zeros(a.num_layers, a.num_kv_heads, N, a.head_dim)
    none = torch.zeros(N, dtype=torch.bool)
    inp = PrefillInputs(ids, k, k.clone(), none, none, torch.zeros(N, dtype=torch.int8),
                        torch.zeros(N, dtype=torch.long))
    res = prefill(model, inp, selection_policy(ReuseConfig(method="naive")))
    assert res.flops == pytest.approx(res.full_flops, rel=1e-9)
