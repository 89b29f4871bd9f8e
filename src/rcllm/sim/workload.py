"""Simulated request streams: per-request token counts and candidate items, as numpy arrays.

The synthetic generator scales to 1M items: popularity is Zipf over item rank (item 0 is the
hottest), items belong to `num_communities` co-occurrence communities (community = rank mod C,
so every community has hot and tail items), and a request's candidates come from its user's
community with probability `p_community`, otherwise from the global popularity. Candidates of
one request may repeat an item (rare except for the very hottest); the cost model then counts
its tokens twice, as a prompt listing it twice would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import RcllmError


@dataclass(frozen=True)
class Workload:
    """Everything the simulator needs about requests, arrival times excluded.

    candidates[i]: item indices (0..num_items-1) of request i; item_tokens[j]: tokens of item j;
    history_reviews[i] / history_tokens[i]: reviews and their tokens in request i's prompt.
    `placement_requests`: an earlier trace (same distribution) the item placement is built from.
    `community[j]`: the generator's community of item j, or None for real traces.
    `retrieval_recall`: for a real trace with retrieved candidates, the retriever's recall
    (share of cases whose target it shortlisted); None otherwise.
    """

    name: str
    item_tokens: np.ndarray        # [num_items] int
    candidates: np.ndarray         # [n, C] int
    history_reviews: np.ndarray    # [n] int
    history_tokens: np.ndarray     # [n] int
    prefix_tokens: int             # shared task instruction
    fresh_tokens: int              # request-specific bits + question
    placement_requests: np.ndarray  # [m, C] int
    community: np.ndarray | None = None
    retrieval_recall: float | None = None

    @property
    def num_items(self) -> int:
        return len(self.item_tokens)

    @property
    def num_requests(self) -> int:
        return len(self.candidates)

    def context_tokens(self) -> np.ndarray:
        """Prompt length of every request."""
        items = self.item_tokens[self.candidates].sum(axis=1)
        return self.prefix_tokens + self.fresh_tokens + self.history_tokens + items


@dataclass(frozen=True)
class SyntheticSpec:
    num_items: int = 100_000
    num_requests: int = 20_000
    num_candidates: int = 20
    num_communities: int = 400
    zipf_alpha: float = 1.0
    p_community: float = 0.8
    item_tokens_mean: float = 100.0
    history_reviews: int = 10
    review_tokens_mean: float = 50.0
    prefix_tokens: int = 200        # ~7–10% of a ~2.7k-token prompt, as in the paper's traces
    fresh_tokens: int = 60
    placement_requests: int = 20_000
    seed: int = 0

    def validate(self) -> None:
        if self.num_items < self.num_communities or self.num_communities < 1:
            raise RcllmError("need num_items >= num_communities >= 1")
        if not 0.0 <= self.p_community <= 1.0 or self.zipf_alpha <= 0:
            raise RcllmError("p_community must be in [0, 1] and zipf_alpha > 0")
        if self.num_requests < 1 or self.num_candidates < 1:
            raise RcllmError("num_requests and num_candidates must be >= 1")


def _zipf_cdf(n: int, alpha: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1, dtype=float) ** alpha
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def _draw_candidates(rng: np.random.Generator, spec: SyntheticSpec, n: int) -> np.ndarray:
    c = spec.num_communities
    per_comm = spec.num_items // c
    global_cdf = _zipf_cdf(spec.num_items, spec.zipf_alpha)
    comm_cdf = _zipf_cdf(per_comm, spec.zipf_alpha)
    shape = (n, spec.num_candidates)
    user_comm = rng.integers(0, c, size=n)[:, None]
    in_comm = user_comm + c * np.searchsorted(comm_cdf, rng.random(shape))
    global_pick = np.searchsorted(global_cdf, rng.random(shape))
    use_comm = rng.random(shape) < spec.p_community
    return np.where(use_comm, in_comm, global_pick).astype(np.int64)


def synthetic_workload(spec: SyntheticSpec = SyntheticSpec()) -> Workload:
    """A seeded synthetic workload (deterministic for a given spec)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    sigma = 0.5  # lognormal spread of text lengths
    mu_item = np.log(spec.item_tokens_mean) - sigma ** 2 / 2
    item_tokens = np.clip(rng.lognormal(mu_item, sigma, spec.num_items), 20, 400).astype(np.int64)
    cands = _draw_candidates(rng, spec, spec.num_requests)
    train = _draw_candidates(rng, spec, spec.placement_requests)
    reviews = np.full(spec.num_requests, spec.history_reviews, dtype=np.int64)
    mu_rev = np.log(spec.review_tokens_mean) - sigma ** 2 / 2
    review_tokens = np.clip(rng.lognormal(mu_rev, sigma, (spec.num_requests, spec.history_reviews)),
                            5, 300).astype(np.int64)
    return Workload(name=f"synthetic-{spec.num_items}", item_tokens=item_tokens, candidates=cands,
                    history_reviews=reviews, history_tokens=review_tokens.sum(axis=1),
                    prefix_tokens=spec.prefix_tokens, fresh_tokens=spec.fresh_tokens,
                    placement_requests=train,
                    community=np.arange(spec.num_items) % spec.num_communities)


def poisson_arrivals_ms(rng: np.random.Generator, n: int, qps: float) -> np.ndarray:
    """Arrival times (ms, ascending, first > 0) of a Poisson process at `qps` requests/s."""
    if qps <= 0:
        raise RcllmError(f"qps must be > 0, got {qps}")
    return np.cumsum(rng.exponential(1000.0 / qps, size=n))
