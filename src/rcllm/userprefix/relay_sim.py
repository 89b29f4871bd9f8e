"""A small discrete-event simulation of ranking with and without pre-inference relay.

Entities: K instances, each one non-preemptive server with two FIFO queues — ranking requests
first, pre-inference jobs only when no ranking waits. Each ranking request of a user with an
L-token user side and C candidates is announced by a prewarm signal `lead_ms` earlier.

- Without relay a ranking costs fixed + prefix(L) + candidates(C).
- With relay the prewarm goes (affinity) to the request's instance; if the `Trigger` admits it
  (long enough prefix, resident bytes + this prefix within the bound, pre-inference jobs in the
  instance below the load bound) a pre-inference job prefix(L) is queued and its bytes are
  reserved until the ranking finishes. The ranking then costs fixed + candidates(C) if the
  prefix is done or running (it waits for the server anyway); a pre-inference still queued is
  cancelled and the ranking pays the full cost.

Costs are linear: prefix(L) = per_token_ms × L, candidates(C) = per_candidate_ms × C.
Latency = ranking finish − ranking arrival. No torch; randomness from one seeded generator.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .trigger import RelayConfig, Trigger

PREWARM, ARRIVAL, DONE = 0, 1, 2


@dataclass(frozen=True)
class SimParams:
    instances: int = 4
    requests: int = 4000
    candidates: int = 100
    fixed_ms: float = 2.0
    per_token_ms: float = 0.02        # prefix cost per user-side token
    per_candidate_ms: float = 0.1     # batched candidate cost per candidate
    lead_ms: float = 80.0             # prewarm signal ahead of the ranking request
    bytes_per_token: int = 92_160     # SmolLM2-135M fp32 K+V: 2 × 30 × 3 × 64 × 4
    seed: int = 0
    relay: RelayConfig = field(default_factory=lambda: RelayConfig(
        min_prefix_tokens=512, max_prefix_tokens=1 << 20, max_cache_bytes=8 << 30,
        max_inflight=4))


@dataclass
class _Req:
    arrival_ms: float
    tokens: int
    instance: int
    pre: str = "none"        # none | queued | running | done | cancelled
    finish_ms: float = 0.0


@dataclass
class _Inst:
    busy: bool = False
    rank_q: deque = field(default_factory=deque)
    pre_q: deque = field(default_factory=deque)
    resident_bytes: int = 0
    pre_jobs: int = 0


def _next_job(p: SimParams, inst: _Inst, reqs: list) -> tuple[float, tuple[str, int]] | None:
    """An idle instance's next job and its cost (ms): a ranking first (with its user side
    computed in the request unless a prewarm finished), else a queued prewarm; None when idle."""
    if inst.rank_q:
        i = inst.rank_q.popleft()
        cost = p.fixed_ms + p.per_candidate_ms * p.candidates
        if reqs[i].pre != "done":
            cost += p.per_token_ms * reqs[i].tokens
        return cost, ("rank", i)
    if inst.pre_q:
        i = inst.pre_q.popleft()
        reqs[i].pre = "running"
        return p.per_token_ms * reqs[i].tokens, ("pre", i)
    return None


def simulate(p: SimParams, rate_per_s: float, tokens: np.ndarray, relay: bool) -> np.ndarray:
    """Ranking latencies (ms) of len(tokens) requests arriving as a Poisson process."""
    rng = np.random.default_rng(p.seed)
    arrivals = np.cumsum(rng.exponential(1000.0 / rate_per_s, size=len(tokens)))
    routes = rng.integers(0, p.instances, size=len(tokens))  # affinity: user hash → instance
    reqs = [_Req(float(a), int(n), int(k)) for a, n, k in zip(arrivals, tokens, routes)]
    insts = [_Inst() for _ in range(p.instances)]
    trigger = Trigger(p.relay)
    heap: list = []
    for i, r in enumerate(reqs):
        heapq.heappush(heap, (r.arrival_ms, ARRIVAL, i))
        if relay:
            heapq.heappush(heap, (max(0.0, r.arrival_ms - p.lead_ms), PREWARM, i))

    def start(now: float, k: int) -> None:
        inst = insts[k]
        nxt = None if inst.busy else _next_job(p, inst, reqs)
        if nxt is not None:
            inst.busy = True
            heapq.heappush(heap, (now + nxt[0], DONE, (k, nxt[1])))

    while heap:
        now, kind, payload = heapq.heappop(heap)
        if kind == PREWARM:
            r = reqs[payload]
            inst = insts[r.instance]
            size = r.tokens * p.bytes_per_token
            if trigger.decide(r.tokens, size, inst.resident_bytes, inst.pre_jobs).admitted:
                r.pre = "queued"
                inst.resident_bytes += size
                inst.pre_jobs += 1
                inst.pre_q.append(payload)
                start(now, r.instance)
        elif kind == ARRIVAL:
            r = reqs[payload]
            inst = insts[r.instance]
            if r.pre == "queued":  # not started in time: cancel, compute in the request
                inst.pre_q.remove(payload)
                inst.pre_jobs -= 1
                r.pre = "cancelled"
            inst.rank_q.append(payload)
            start(now, r.instance)
        else:
            k, (what, i) = payload
            inst = insts[k]
            inst.busy = False
            r = reqs[i]
            if what == "pre":
                r.pre = "done"
                inst.pre_jobs -= 1
            else:
                r.finish_ms = now
                if r.pre in ("done", "cancelled"):
                    inst.resident_bytes -= r.tokens * p.bytes_per_token
            start(now, k)
    return np.array([r.finish_ms - r.arrival_ms for r in reqs])


def p99_ms(p: SimParams, rate_per_s: float, tokens: np.ndarray, relay: bool) -> float:
    return float(np.percentile(simulate(p, rate_per_s, tokens, relay), 99))


def max_rate(p: SimParams, tokens: np.ndarray, relay: bool, slo_ms: float,
             hi_per_s: float = 5000.0, steps: int = 14) -> float:
    """The highest Poisson rate (req/s, bisection) whose P99 latency meets `slo_ms`; 0 when
    even a nearly idle cluster misses it."""
    lo, hi = 1e-3 * hi_per_s, hi_per_s
    if p99_ms(p, lo, tokens, relay) > slo_ms:
        return 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p99_ms(p, mid, tokens, relay) <= slo_ms else (lo, mid)
    return lo


def longest_sequence(p: SimParams, rate_per_s: float, relay: bool, slo_ms: float,
                     hi_tokens: int = 20_000) -> int:
    """The longest user side (tokens, every user the same) meeting `slo_ms` at P99."""
    lo, hi = 0, hi_tokens
    while hi - lo > 16:
        mid = (lo + hi) // 2
        tokens = np.full(p.requests, mid)
        lo, hi = (mid, hi) if p99_ms(p, rate_per_s, tokens, relay) <= slo_ms else (lo, mid)
    return lo


def user_lengths(p: SimParams, median_tokens: int, sigma: float = 0.3) -> np.ndarray:
    """Lognormal user-side lengths around `median_tokens` (log-σ `sigma`), at least 64."""
    rng = np.random.default_rng(p.seed + 1)
    return np.maximum(64, rng.lognormal(np.log(median_tokens), sigma, p.requests)).astype(int)
