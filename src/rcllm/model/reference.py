"""The machine's speed at the moment of a run: one fixed forward pass, timed.

A shared VM's speed drifts (measured here: the same requests 25% slower within an hour), so a
cost model fitted on one run predicts another run only once both are put on one scale. Every
`rcllm bench ttft` run (what `rcllm sim sweep` fits on) and every cell of a served sweep time
this same pass on the engine's own model and thread settings; the simulator scales its fitted
times by the ratio of the two (`sim.served.speed_scale`).

The pass: `REFERENCE_TOKENS` fixed token ids through every layer, no past, no output head (what
a chunk build runs), once to warm up and then `repeats` times; the median is the reference.
"""

from __future__ import annotations

import statistics
import time

import torch

REFERENCE_TOKENS = 128


def reference_ms(model, tokens: int = REFERENCE_TOKENS, repeats: int = 3) -> float:
    """Median wall time (ms) of the reference pass on `model` in the calling thread."""
    if tokens < 1 or repeats < 1:
        raise ValueError("reference_ms needs tokens >= 1 and repeats >= 1")
    # fixed, ordinary ids (not special tokens); the same on every run of the same model
    ids = ((torch.arange(tokens) * 7919 + 200) % model.arch.vocab_size).to(model.device)
    times = []
    with torch.inference_mode():
        for k in range(repeats + 1):
            t0 = time.perf_counter()
            model.forward(ids, logits=False)
            if k:                      # the first call (allocations) is the warm-up
                times.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(times))
