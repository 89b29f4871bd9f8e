"""Fixtures of the serving tests: a tiny-model engine behind a real HTTP server on loopback."""

from __future__ import annotations

import httpx
import pytest

from rcllm.commands.common import DEFAULT_SYNTHETIC
from rcllm.config import RcllmConfig
from rcllm.engine import Engine
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.serve.app import create_app
from rcllm.serve.local import LocalBackend
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings


@pytest.fixture(scope="module")
def synthetic():
    return load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)


@pytest.fixture(scope="module")
def rank_bodies(synthetic):
    """Real requests of the synthetic workload as /v1/rank bodies (8 candidates each)."""
    cases = build_cases(synthetic, history_window=10, num_negatives=7, seed=0, max_cases=6)
    return [{"user_id": c.user_id, "candidates": list(c.candidates),
             "history": [{"item_id": h.item_id, "rating": h.rating, "review": h.review,
                          "timestamp": h.timestamp} for h in c.history]} for c in cases]


@pytest.fixture(scope="module")
def served(tiny_loaded, synthetic):
    """(base url, backend) of a single-engine server with a queue of 2."""
    engine = Engine(tiny_loaded, dict(synthetic.items), RcllmConfig())
    backend = LocalBackend(engine, queue_size=2)
    running = start_in_thread(create_app(backend, ServeSettings(queue_size=2,
                                                                max_body_bytes=64 << 10)))
    yield running.url, backend
    running.stop()


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[0], timeout=60) as c:
        yield c

