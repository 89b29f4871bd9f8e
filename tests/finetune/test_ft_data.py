"""Training examples: training users only, valid negatives, shuffled labels, deterministic."""

from __future__ import annotations

from collections import Counter

import pytest

from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import split_users
from rcllm.finetune.data import ExampleStream, build_examples, dataset_digest


@pytest.fixture(scope="module")
def ds():
    return load_dataset("", "synthetic", num_users=40, num_items=80, seed=1)


def test_only_training_users_and_their_targets(ds):
    train, val, test = split_users(ds)
    stream = ExampleStream(ds, train, "last", 3, 5, seed=0)
    assert {ex.user_id for ex in stream.examples} <= set(train)
    for ex in stream.examples:
        hist = ds.users[ex.user_id]
        assert ex.target == hist[-1].item_id and ex.history == tuple(hist[:-1][-3:])
    all_targets = build_examples(ds, train, "all", 3)
    assert len(all_targets) == sum(len(ds.users[u]) - 1 for u in train)


def test_draws_are_valid_shuffled_and_deterministic(ds):
    train = split_users(ds)[0]
    stream = ExampleStream(ds, train, "last", 3, 5, seed=0)
    positions = Counter()
    for step in range(300):
        d = stream.draw(step)
        assert d.candidates[d.target_index] == d.example.target
        assert len(set(d.candidates)) == 5
        user_items = {e.item_id for e in ds.users[d.example.user_id]}
        assert not user_items & (set(d.candidates) - {d.example.target})
        positions[d.target_index] += 1
    assert min(positions.values()) > 40  # the target sits at every label position
    again = ExampleStream(ds, train, "last", 3, 5, seed=0)
    assert [again.draw(s) for s in (0, 7, 299)] == [stream.draw(s) for s in (0, 7, 299)]
    assert ExampleStream(ds, train, "last", 3, 5, seed=1).draw(0) != stream.draw(0)


def test_digest_tracks_content():
    ds = load_dataset("", "synthetic", num_users=5, num_items=20, seed=1)
    first = dataset_digest(ds)
    ds.users[sorted(ds.users)[0]].pop()
    assert dataset_digest(ds) != first


def test_no_usable_example_is_an_error(ds):
    with pytest.raises(RcllmError, match="no training example"):
        ExampleStream(ds, [], "last", 3, 5, seed=0)


def test_max_examples_keeps_each_users_latest_targets_round_robin(ds):
    """A cap keeps every user's last target, then every second-to-last, ...; under the cap
    nothing changes; the run key names the cut only when it binds."""
    from rcllm.finetune.config import FinetuneConfig
    from rcllm.finetune.data import cap_examples
    from rcllm.finetune.trainer import run_key

    train = split_users(ds)[0]
    every = build_examples(ds, train, "all", 3)
    users = {ex.user_id for ex in every}
    assert cap_examples(every, 0) == every and cap_examples(every, len(every)) == every
    kept = cap_examples(every, len(users) + 3)
    assert len(kept) == len(users) + 3
    where = [every.index(ex) for ex in kept]
    assert where == sorted(where)                            # original order kept
    last = {u: ds.users[u][-1].item_id for u in users}
    for u in users:                                          # each user's last target is in
        assert any(ex.user_id == u and ex.target == last[u] for ex in kept)
    second = [ex for ex in kept if ex.target != last[ex.user_id]]
    assert len(second) == 3 and all(ex.target == ds.users[ex.user_id][-2].item_id
                                    for ex in second)
    stream = ExampleStream(ds, train, "all", 3, 5, seed=0, limit=len(users))
    assert len(stream) == len(users) and stream.available == len(every)
    cfg = FinetuneConfig()
    assert run_key("m", "d", cfg) == run_key("m", "d", cfg, None)
    assert run_key("m", "d", cfg, 100) != run_key("m", "d", cfg, 200) != run_key("m", "d", cfg)
