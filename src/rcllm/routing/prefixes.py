"""The router's picture of which prompt prefixes each instance's prefix cache holds, for
prefix-aware routing (`policies.PrefixAware`) as deployed with vLLM-style prefix caching.

An instance's prefix cache stores every exact prompt it computes (full, prefix), block by
block, each block's key chaining the keys before it; it evicts least recently used blocks
past its capacity. The router cannot see that cache, so it keeps its own approximate copy, as
SGLang's cache-aware router keeps an approximate radix tree of the requests it routed: per
instance, the chain keys of the prompts it sent there (`insert`), least recently used keys
dropped past the cache's capacity in tokens. A prompt is a chain of segments (its history
entries, then, where the prompt's shared part holds them, its candidates; the instruction is
on every instance and left out), so a key stands for the whole prefix up to its segment, and
the match of a request on an instance is the tokens of its longest chain of held keys
(`matched_tokens`). Segments are content (`requests.prefix_segments`), not token blocks: the
router does not tokenise, and a token block inside a segment is held exactly when the segment
is.

Contract: plain Python, no torch; the simulator can drive the same object. Bounded: at most
`capacity_tokens` per instance (an instance evicts blocks in the same order). `check_invariants`
holds after every call.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Hashable, Iterable, Sequence

import numpy as np

PrefixKey = int


def prefix_chain(segments: Iterable[Hashable]) -> tuple[PrefixKey, ...]:
    """Key i stands for segments[:i + 1] (a stable 64-bit hash chain of their reprs)."""
    keys, prev = [], b""
    for seg in segments:
        prev = hashlib.blake2b(prev + repr(seg).encode(), digest_size=8).digest()
        keys.append(int.from_bytes(prev, "big"))
    return tuple(keys)


class PrefixIndex:
    """Per instance, the prefix keys the router believes its prefix cache holds."""

    def __init__(self, num_instances: int, capacity_tokens: int) -> None:
        if num_instances < 1 or capacity_tokens < 1:
            raise ValueError("a prefix index needs >= 1 instance and a positive capacity")
        self.capacity_tokens = int(capacity_tokens)
        self._held: list[OrderedDict[PrefixKey, int]] = [OrderedDict()
                                                          for _ in range(num_instances)]
        self._tokens = [0] * num_instances

    @property
    def num_instances(self) -> int:
        return len(self._held)

    def insert(self, index: int, keys: Sequence[PrefixKey], tokens: Sequence[int]) -> None:
        """Instance `index` computed (and cached) the prompt of chain `keys` with `tokens` per
        segment: its keys become the most recently used, the least recent leave past the
        capacity."""
        held = self._held[index]
        for key, n in zip(keys, tokens):
            if key in held:
                held.move_to_end(key)
                continue
            held[key] = int(n)
            self._tokens[index] += int(n)
        while self._tokens[index] > self.capacity_tokens and held:
            _key, n = held.popitem(last=False)
            self._tokens[index] -= n

    def matched_tokens(self, keys: Sequence[PrefixKey], tokens: Sequence[int],
                       instances: Sequence[int] | None = None) -> np.ndarray:
        """Tokens of the longest held chain prefix of `keys` on each of `instances` (all when
        None), in their order: float array [len(instances)]. Reads only (no LRU touch: the
        instance that is sent the request touches its blocks then, `insert`)."""
        which = range(self.num_instances) if instances is None else instances
        out = np.zeros(len(which))
        for pos, k in enumerate(which):
            held, n = self._held[k], 0
            for key, t in zip(keys, tokens):
                if key not in held:
                    break
                n += int(t)
            out[pos] = n
        return out

    def forget(self, index: int) -> None:
        """Instance `index` is gone (dead): nothing of it is reusable."""
        self._held[index].clear()
        self._tokens[index] = 0

    def held_tokens(self, index: int) -> int:
        return self._tokens[index]

    def check_invariants(self) -> None:
        for k, held in enumerate(self._held):
            assert self._tokens[k] == sum(held.values()), "token count drifted"
            assert self._tokens[k] <= self.capacity_tokens or not held, "over capacity"


class PrefixView:
    """The prefix picture of some instances, in a cluster view's order (`ClusterView.prefixes`):
    what a policy reads."""

    def __init__(self, index: PrefixIndex, instances: Sequence[int]) -> None:
        self.index = index
        self.instances = list(instances)
        self.num_instances = len(self.instances)

    def matched_tokens(self, keys: Sequence[PrefixKey], tokens: Sequence[int]) -> np.ndarray:
        return self.index.matched_tokens(keys, tokens, self.instances)
