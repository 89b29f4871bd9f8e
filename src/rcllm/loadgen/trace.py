"""A request trace from a dataset's review timestamps, for `rcllm bench serve --sweep`.

Every review of a user who has at least one earlier review is one request: the user, their
last `history_window` earlier reviews as the history, and as candidates the item-kNN
retriever's shortlist for that history (RcLLM's retrieval stage, `eval.protocol`; the reviewed
item is kept in the shortlist, replacing its last entry when the retriever missed it). The
trace is the last `n` such requests in time order, so a user who reviewed twice in that span
comes twice, with the longer history the second time (user repeats kept: what the user-prefix
cache and affinity routing feed on).

Arrivals: review timestamps are whole days in the Amazon 2018 files, so requests of one day
are spread uniformly over it (seeded) before the span is compressed linearly to the target
rate: arrival_s = (t - t_first) * (n - 1) / (rate * span). The relative gaps of the trace —
its bursts and lulls — are kept at every rate; only the time scale changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import RcllmError
from ..records import Dataset


@dataclass(frozen=True)
class Trace:
    bodies: list[dict]          # /v1/rank bodies, in arrival order
    times_s: np.ndarray         # review time (s since the epoch, ties spread over the day)
    users: list[str]
    retrieval_recall: float     # share of requests whose reviewed item the retriever found

    def arrivals_s(self, rate: float) -> np.ndarray:
        """Arrival times (s from the first) compressed so that the mean rate is `rate`."""
        if rate <= 0:
            raise RcllmError(f"rate must be > 0, got {rate}")
        t = self.times_s - self.times_s[0]
        n = len(t)
        if n < 2 or t[-1] <= 0:
            return np.arange(n) / rate
        return t * ((n - 1) / rate) / t[-1]

    def repeats(self) -> int:
        """Requests whose user came earlier in the trace."""
        return len(self.users) - len(set(self.users))

    def summary(self) -> dict:
        return {"requests": len(self.bodies), "users": len(set(self.users)),
                "repeat_requests": self.repeats(),
                "span_days": float((self.times_s[-1] - self.times_s[0]) / 86_400)
                if len(self.times_s) else 0.0,
                "retrieval_recall": self.retrieval_recall}


def review_trace(ds: Dataset, n: int, num_candidates: int = 20, history_window: int = 10,
                 seed: int = 0) -> Trace:
    """The last `n` review events of `ds` as requests (module docstring)."""
    from ..eval.protocol import ItemKnnRetriever

    if n < 1:
        raise RcllmError("the trace needs at least one request")
    rng = np.random.default_rng(seed)
    events = []                      # (time, user, index of the review in the user's history)
    for user in sorted(ds.users):
        hist = ds.users[user]
        for k in range(1, len(hist)):
            events.append((float(hist[k].timestamp), user, k))
    if not events:
        raise RcllmError("no user has two reviews: no request can be built")
    jitter = rng.uniform(0, 86_400, size=len(events))
    order = sorted(range(len(events)), key=lambda i: (events[i][0] + jitter[i], events[i][1],
                                                      events[i][2]))
    chosen = order[-n:]
    retriever = ItemKnnRetriever(ds)
    bodies, times, users, found = [], [], [], []
    for i in chosen:
        t, user, k = events[i]
        hist = ds.users[user]
        target = hist[k].item_id
        past = hist[:k][-history_window:]
        seen = {h.item_id for h in hist[:k]}
        short = retriever.shortlist(sorted(seen), num_candidates, seen - {target})
        hit = target in short
        if not hit:
            short = [*short[:num_candidates - 1], target]
        if len(short) < 2:
            continue
        cands = [short[j] for j in np.random.default_rng([seed, k, len(users)])
                 .permutation(len(short)).tolist()]
        bodies.append({"user_id": str(user), "candidates": [str(c) for c in cands],
                       "history": [{"item_id": str(h.item_id), "rating": h.rating,
                                    "review": h.review, "timestamp": h.timestamp}
                                   for h in past]})
        times.append(t + jitter[i])
        users.append(str(user))
        found.append(hit)
    if not bodies:
        raise RcllmError("no request of the trace has two candidates")
    return Trace(bodies, np.asarray(times), users, float(np.mean(found)))
