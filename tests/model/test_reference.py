"""The reference pass (`rcllm.model.reference`): the machine's speed, timed the same way by
every fit run and before every served sweep cell."""

from __future__ import annotations

import pytest


def test_the_reference_pass_times_a_fixed_forward_pass(tiny_loaded, monkeypatch):
    """`reference_ms`: the median of `repeats` timed passes after one untimed warm-up, each the
    same fixed ids through the model without its output head."""
    from rcllm.model import reference

    seen, clock = [], iter([0.0, 10.0, 10.02, 20.0, 20.05, 30.0, 30.03])
    real = tiny_loaded.model.forward

    def forward(ids, **kw):
        seen.append((ids.tolist(), kw))
        return real(ids, **kw)

    monkeypatch.setattr(tiny_loaded.model, "forward", forward)
    monkeypatch.setattr(reference.time, "perf_counter", lambda: next(clock))
    assert reference.reference_ms(tiny_loaded.model, tokens=16, repeats=3) == pytest.approx(30.0)
    assert len(seen) == 4 and all(s == seen[0] for s in seen)
    assert len(seen[0][0]) == 16 and seen[0][1] == {"logits": False}
    assert max(seen[0][0]) < tiny_loaded.model.arch.vocab_size
    with pytest.raises(ValueError):
        reference.reference_ms(tiny_loaded.model, repeats=0)
