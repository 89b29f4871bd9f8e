"""A tokenizer-free token estimate, so the catalog package needs no torch or transformers.

English text averages about 1.3 BPE tokens per whitespace-separated word for Llama/Qwen-style
tokenizers; the sharding only needs relative sizes (node weights, per-shard totals), so this
estimate is enough. Callers that have exact counts pass them instead.
"""

from __future__ import annotations

import math

TOKENS_PER_WORD = 1.3


def estimate_tokens(text: str, tokens_per_word: float = TOKENS_PER_WORD) -> int:
    """Estimated token count of `text`: ceil(words × tokens_per_word), at least 1."""
    return max(1, math.ceil(len(text.split()) * tokens_per_word))
