"""What a rank request returns: the ranking and scores (`RankResult`) and what the request did
(`RankStats`: sizes, cache look-ups, recomputation, FLOPs and where the time went)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import torch

from ..prompt.builder import KINDS
from ..records import ItemId


def thread_run_wait_ns() -> int | None:
    """Nanoseconds the calling thread has been runnable but not running, waiting for a core
    (the second field of Linux's /proc/thread-self/schedstat); None where it is not reported."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None

# where a slot's KV came from before the prefill (explain): fresh = computed in the request
SOURCES = ("fresh", "prefix", "user_prefix", "chunk", "prototype")


@dataclass
class RankStats(Mapping):
    """What one request did: sizes, cache look-ups, recomputation, FLOPs and where the time
    went. Reads like a mapping (`stats["chunk_hits"]`, `dict(stats)`) for reports and JSON."""

    tokens: int = 0                  # KV slots of the prompt (with blocks: user side + blocks)
    prefix_tokens: int = 0           # exact tokens from the prefix cache
    user_prefix: str = "off"         # pointwise: hit | append | miss | off (user-prefix cache)
    user_prefix_tokens: int = 0      # exact tokens from the user-prefix cache
    chunk_hits: int = 0
    chunk_misses: int = 0
    reused_tokens: dict = field(default_factory=lambda: {"history": 0, "item": 0})
    prototype_tokens: int = 0
    prototype_chunks: int = 0
    recomputed_tokens: int = 0
    recomputed_fraction: float = 0.0  # of the slots computed at layer 1 (the deepest set)
    # tokens computed at each layer >= 1 (a depth schedule shrinks them) and their mean share of
    # the slots over those layers: what the FLOPs follow, where recomputed_fraction is layer 1's
    layer_tokens: tuple = ()
    mean_recomputed_fraction: float = 0.0
    recomputed_by_kind: dict = field(default_factory=dict)
    tokens_by_kind: dict = field(default_factory=dict)
    layer0_tokens: int = 0
    flops: float = 0.0
    full_flops: float = 0.0
    truncated_history: int = 0
    # [computed, context] tokens of each job queued behind the answer on the store's builder
    # thread (the build of a kind's missed chunks, one pass; the exact user side): CPU the
    # instance spends after it
    behind_tokens: list = field(default_factory=list)
    build_ms: float = 0.0            # prompt build + tokenise
    assemble_ms: float = 0.0         # cache look-ups + KV gather
    prefill_ms: float = 0.0          # prefill + first-token scoring
    # CPU time of the thread that ran the request, up to the first token: with model.threads=1
    # every op runs on it, so thread_cpu_ms below the TTFT is time it waited (for a core or on
    # I/O)
    thread_cpu_ms: float = 0.0
    # of the rest, the time that thread was runnable but waiting for a core (Linux schedstat;
    # None where the kernel does not report it): TTFT - thread_cpu_ms - run_wait_ms is the time
    # it was blocked (a Redis round trip, a lock)
    run_wait_ms: float | None = None
    # the engine's own work after the answer, on the request's thread (prefix insert, queueing
    # or running the builds, storing the user side): the engine is busy, the clock stopped
    after_ms: float = 0.0

    def add_prefill(self, res, kinds: torch.Tensor) -> None:
        """The recompute and FLOP fields from the prefill's result (`PrefillResult`); `kinds`
        [N] the slots' kind codes (prompt.builder.KINDS)."""
        computed = res.computed.cpu()
        self.recomputed_tokens = int(computed.sum())
        self.recomputed_fraction = float(computed.float().mean())
        layers = self.layer_tokens = tuple(res.layer_tokens)
        self.mean_recomputed_fraction = (sum(layers) / (len(layers) * len(computed)) if layers
                                         else self.recomputed_fraction)
        self.recomputed_by_kind = {k: int((computed & (kinds == KINDS.index(k))).sum())
                                   for k in KINDS}
        self.tokens_by_kind = {k: int((kinds == KINDS.index(k)).sum()) for k in KINDS}
        self.layer0_tokens = res.layer0_computed
        self.flops, self.full_flops = res.flops, res.full_flops

    def __getitem__(self, name: str):
        if name not in self._names():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


@dataclass
class RankResult:
    ranking: list[ItemId]            # best first
    scores: dict[ItemId, float]      # log-scores (higher is better)
    method: str
    ttft_ms: float                   # request arrival → first-token logits
    total_ms: float                  # including likelihood scoring where used
    stats: RankStats = field(default_factory=RankStats)
    # kept when asked: [V] logits of the last position and its final-normed hidden state [d];
    # with the pointwise scorer each candidate's (yes, no) logits [C, 2] and hidden [C, d]
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    # rank(explain=True): every token with the source of its KV and what the selection did,
    # and the TTFT in parts (see Engine.explain)
    explain: dict | None = None
