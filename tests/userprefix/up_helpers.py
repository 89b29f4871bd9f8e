"""Shared set-up for the userprefix tests: a tiny-model ranker over the synthetic dataset."""

from __future__ import annotations

from rcllm.userprefix.cache import PrefixCacheConfig, UserPrefixCache
from rcllm.userprefix.ranker import UserPrefixRanker
from rcllm.bench.userprefix_workload import pointwise_prompt, synthetic_dataset


class FakeClock:
    def __init__(self, now_s: float = 1000.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def make_ranker(loaded, clock=None, max_prefix_tokens: int = 4096, **cache_kw):
    dataset = synthetic_dataset(seed=0, num_users=12, num_items=60)
    prompt = pointwise_prompt(loaded, dataset, max_prefix_tokens)
    cache = UserPrefixCache(PrefixCacheConfig(**cache_kw), loaded.fingerprint,
                            clock or FakeClock())
    return UserPrefixRanker(loaded, prompt, cache), dataset
