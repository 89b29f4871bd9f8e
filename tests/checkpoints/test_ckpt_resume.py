"""Exact resume on the recurrent model, and the checkpoint store's accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rcllm.checkpoints.model import RecurrentConfig, RecurrentLM
from rcllm.checkpoints.planner import plan_optimal
from rcllm.checkpoints.distributions import workload
from rcllm.checkpoints.resume import capture, resume
from rcllm.checkpoints.store import CheckpointStore, PrefixId
from rcllm.errors import RcllmError

N = 300
P = PrefixId("doc")


@pytest.fixture(scope="module")
def model() -> RecurrentLM:
    return RecurrentLM(RecurrentConfig(chunk_tokens=32))


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, 256, (N,), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def full(model, tokens):
    """Full prefills from the zero state, memoised per depth."""
    cache: dict[int, object] = {}

    def get(depth: int):
        if depth not in cache:
            cache[depth] = model.prefill(tokens[:depth])
        return cache[depth]
    return get


def test_resume_is_bit_identical_to_full_prefill(model, tokens, full):
    store = CheckpointStore()
    positions = plan_optimal(workload("multimodal", N), N, 5).positions
    capture(model, store, P, tokens, positions)
    store.check_invariants()
    assert store.positions(P) == positions
    for depth in sorted({1, 2, 31, 33, positions[0], positions[0] + 1, positions[2] + 7, 299, N}):
        got = resume(model, store, P, tokens, depth)
        ref = full(depth)
        assert got.resumed_from == max([0] + [c for c in positions if c <= depth])
        assert got.state.equal(ref.state), f"state differs at depth {depth}"
        assert torch.equal(got.hidden, ref.hidden[got.resumed_from:depth])
        assert torch.allclose(got.hidden, ref.hidden[got.resumed_from:depth], atol=1e-5)


def test_continuing_after_resume_gives_the_same_logits(model, tokens, full):
    store = CheckpointStore()
    capture(model, store, P, tokens[:200], [50, 120])
    question = torch.tensor([7, 8, 9, 10])
    resumed = resume(model, store, P, tokens, 150)
    a = model.prefill(question, resumed.state)
    b = model.prefill(torch.cat([tokens[:150], question]))
    assert torch.equal(a.last_logits(model), b.last_logits(model))
    assert torch.equal(a.hidden, b.hidden[150:])


def test_resume_at_a_checkpoint_or_zero_replays_nothing_extra(model, tokens, full):
    store = CheckpointStore()
    capture(model, store, P, tokens, [100])
    at = resume(model, store, P, tokens, 100)
    assert at.replayed_tokens == 0 and at.state.equal(full(100).state)
    before = resume(model, store, P, tokens, 60)
    assert before.resumed_from == 0 and before.replayed_tokens == 60
    assert resume(model, store, P, tokens, 0).state.position == 0
    with pytest.raises(RcllmError):
        resume(model, store, P, tokens, N + 1)
    with pytest.raises(RcllmError):
        capture(model, store, P, tokens, [0])


def test_state_is_not_mutated_by_resume(model, tokens):
    store = CheckpointStore()
    capture(model, store, P, tokens, [64])
    snap = store.deepest(P, 64).clone()
    resume(model, store, P, tokens, 200)
    assert store.deepest(P, 64).equal(snap)


def test_state_size_grows_with_head_dim_squared():
    small = RecurrentLM(RecurrentConfig(head_dim=16)).zero_state().nbytes
    big = RecurrentLM(RecurrentConfig(head_dim=32)).zero_state().nbytes
    assert big > 3 * small


class _Snap:
    def __init__(self, position: int, size: int):
        self.position, self._size = position, size

    @property
    def nbytes(self) -> int:
        return self._size


def test_store_floor_lookup_eviction_and_accounting():
    store = CheckpointStore(capacity_bytes=100)
    assert store.deepest(P, 10) is None
    for pos in (10, 30, 20):
        assert store.put(P, _Snap(pos, 30))
    store.check_invariants()
    assert store.positions(P) == (10, 20, 30) and store.nbytes == 90
    assert store.deepest(P, 25).position == 20
    assert store.deepest(P, 9) is None
    assert store.deepest(P, 1000).position == 30  # touch 30: LRU order is now 10, 20, 30
    assert store.put(PrefixId("other"), _Snap(5, 30))  # evicts 10
    store.check_invariants()
    assert store.positions(P) == (20, 30) and store.evictions == 1
    assert not store.put(P, _Snap(40, 101))  # larger than the whole budget
    assert store.put(P, _Snap(20, 10))  # replace in place
    store.check_invariants()
    assert store.nbytes == 70 and len(store) == 3
    assert store.remove_prefix(P) == 2
    store.check_invariants()
    assert store.nbytes == 30 and store.hits == 2 and store.misses == 2
    with pytest.raises(ValueError):
        store.put(P, _Snap(0, 1))


def test_store_invariants_under_random_operations():
    rng = np.random.default_rng(11)
    store = CheckpointStore(capacity_bytes=500)
    for _ in range(400):
        prefix = PrefixId(f"p{rng.integers(3)}")
        if rng.random() < 0.6:
            store.put(prefix, _Snap(int(rng.integers(1, 50)), int(rng.integers(1, 120))))
        elif rng.random() < 0.9:
            hit = store.deepest(prefix, int(rng.integers(0, 60)))
            assert hit is None or hit.position < 60
        else:
            store.remove_prefix(prefix)
        store.check_invariants()
