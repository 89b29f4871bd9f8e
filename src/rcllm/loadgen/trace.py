"""A request trace from a dataset's review timestamps, for `rcllm bench serve --sweep`.

Every review of a user who has at least one earlier review is one request: the user, their
last `history_window` earlier reviews as the history, and as candidates the item-kNN
retriever's shortlist for that history (RcLLM's retrieval stage, `eval.protocol`; the reviewed
item is kept in the shortlist, replacing its last entry when the retriever missed it). The
trace is `n` such requests that follow each other in time (a contiguous window of the dataset's
review events), in time order, so a user who reviewed twice in that span comes twice, with the
longer history the second time (user repeats kept: what the user-prefix cache and affinity
routing feed on).

Which window (`window`, `rcllm bench serve --sweep --trace-window`):
- `users` (default): of all windows of `n` consecutive events, the one with the most distinct
  users (ties: the latest). The tail of a dataset can be a few users' rating sessions: on
  MovieLens 100K the last 60 ratings come from 3 users within 8 hours (57 repeats), a
  workload no cluster would see; the busiest window in users keeps the real mix of users, and
  being contiguous it keeps the real gaps between arrivals — the bursts of a user's session
  and the lulls between sessions — and the repeats within it.
- `tail`: the last `n` events (what the sweeps recorded before 2026-12-06 used).
- `at:P` (0 <= P <= 1): the window whose first event is at the P-quantile of the events' times
  (`at:0.5` starts at the median time), clipped so that it holds `n` events.
Sessions (`session_gap_s`, `--trace-session-gap-s`, default 0 = off): a user's ratings at most
`session_gap_s` after their previous one belong to one visit, and only a visit's first rating
makes a request (its history: everything rated before it; a user's first visit makes none, as
their first rating makes none). MovieLens users rate dozens of films
in one sitting, so even its busiest window of 100 ratings holds 20 users (80 repeats, gaps' CV
3.2, over 1.1 days; the last 100: 6 users); counted by visits with a 30-minute gap its busiest
100 visits hold 74 users (26 repeats, gaps' CV 2.0, over 8.9 days): a request per visit, as a
recommender would be asked.
The trace's `summary()` reports users per 100 requests and the coefficient of variation of the
inter-arrival gaps (1 for Poisson arrivals, above 1 burstier), so the choice is visible in
every sweep's output; and of the repeat requests, how many carry the user's previous history
grown at its end (`history_extends`: the previous prompt's history is a prefix of this one's,
so prefix caching serves it on the instance that served the previous one), and how many share
their whole shorter history with the previous request (`history_prefix_shared`: also a
history that came out shorter, as when a user's reviews of one day, spread over the day in
random order, arrive out of order: the cached longer prompt holds it all). A sliding window
(the last `history_window` reviews, full once a user has that many) does neither: its first
review drops as a new one joins.

Arrivals: review timestamps are whole days in the Amazon 2018 files, so requests of one day
are spread uniformly over it (seeded); timestamps with seconds (MovieLens) are spread only
within their second, so their gaps are the real ones. The span is then compressed linearly to
the target rate: arrival_s = (t - t_first) * (n - 1) / (rate * span). The relative gaps of the
trace — its bursts and lulls — are kept at every rate; only the time scale changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import RcllmError
from ..records import Dataset
from ..routing.requests import entry_key

WINDOWS = ("users", "tail", "at:P")
DAY_S = 86_400


@dataclass(frozen=True)
class Trace:
    bodies: list[dict]          # /v1/rank bodies, in arrival order
    times_s: np.ndarray         # review time (s since the epoch, ties spread over the day)
    users: list[str]
    retrieval_recall: float     # share of requests whose reviewed item the retriever found
    window: str = "tail"        # how the events were chosen (module docstring)
    session_gap_s: float = 0.0  # > 0: one request per visit (module docstring)
    targets: tuple[str, ...] = ()   # each request's reviewed item (what it is scored on)

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

    def history_growth(self) -> tuple[int, int]:
        """Of the repeat requests, (those whose history is the user's previous request's
        with entries added at its end, those sharing their whole shorter history with it as a
        prefix): module docstring."""
        last: dict[str, list] = {}
        grew = shared = 0
        for b in self.bodies:
            hist = [entry_key(h) for h in b["history"]]
            prev = last.get(b["user_id"])
            if prev is not None:
                n = min(len(prev), len(hist))
                grew += len(prev) < len(hist) and hist[:n] == prev
                shared += n > 0 and hist[:n] == prev[:n]
            last[b["user_id"]] = hist
        return grew, shared

    def gap_cv(self) -> float:
        """Coefficient of variation of the inter-arrival gaps (std / mean): 1 for Poisson
        arrivals, above 1 burstier; NaN with fewer than 3 requests or no span."""
        gaps = np.diff(self.times_s)
        if len(gaps) < 2 or gaps.mean() <= 0:
            return float("nan")
        return float(gaps.std() / gaps.mean())

    def summary(self) -> dict:
        n = len(self.bodies)
        return {"requests": n, "users": len(set(self.users)),
                "users_per_100_requests": 100.0 * len(set(self.users)) / max(1, n),
                "repeat_requests": self.repeats(),
                **dict(zip(("history_extends", "history_prefix_shared"),
                           self.history_growth())),
                "gap_cv": self.gap_cv(),
                "window": self.window, "session_gap_s": self.session_gap_s,
                "span_days": float((self.times_s[-1] - self.times_s[0]) / DAY_S)
                if len(self.times_s) else 0.0,
                "retrieval_recall": self.retrieval_recall,
                # the working set: distinct items over every request's candidates (placement
                # and routing can only decide hits where it outgrows an instance's item budget)
                "candidate_items": len({i for b in self.bodies for i in b["candidates"]})}


def parse_window(spec: str) -> tuple[str, float]:
    """'users' | 'tail' | 'at:P' → (kind, P); a bad spec is refused with the choices."""
    if spec in ("users", "tail"):
        return spec, 0.0
    if spec.startswith("at:"):
        try:
            p = float(spec[3:])
        except ValueError:
            p = -1.0
        if 0.0 <= p <= 1.0:
            return "at", p
    raise RcllmError(f"trace window {spec!r}: use users, tail or at:P with 0 <= P <= 1")


def window_start(users: list, times: np.ndarray, n: int, spec: str) -> int:
    """Index of the first of the `n` consecutive events (sorted by time: `users`, `times`)
    that window `spec` chooses (module docstring)."""
    kind, p = parse_window(spec)
    last = max(0, len(users) - n)
    if kind == "tail":
        return last
    if kind == "at":
        return min(last, int(np.searchsorted(times, np.quantile(times, p), side="left")))
    counts: dict = {}
    for u in users[:n]:
        counts[u] = counts.get(u, 0) + 1
    best, best_start = len(counts), 0
    for start in range(1, last + 1):     # slide: drop users[start - 1], add users[start + n - 1]
        out, into = users[start - 1], users[start + n - 1]
        counts[out] -= 1
        if not counts[out]:
            del counts[out]
        counts[into] = counts.get(into, 0) + 1
        if len(counts) >= best:          # ties: the later window
            best, best_start = len(counts), start
    return best_start


def _events(ds: Dataset, rng: np.random.Generator) -> list[tuple[float, str, int]]:
    """(time, user, index of the review in the user's history) of every request-making review,
    in time order, ties spread (over the day for whole-day timestamps, else within the
    second)."""
    raw: list[tuple[float, str, int]] = []
    for user in sorted(ds.users):
        hist = ds.users[user]
        raw += [(float(hist[k].timestamp), user, k) for k in range(1, len(hist))]
    if not raw:
        raise RcllmError("no user has two reviews: no request can be built")
    whole_days = all(t % DAY_S == 0 for t, _u, _k in raw)
    spread = rng.uniform(0, DAY_S if whole_days else 1.0, size=len(raw))
    events = [(t + s, u, k) for (t, u, k), s in zip(raw, spread)]
    return sorted(events, key=lambda e: (e[0], e[1], e[2]))


def visits(ds: Dataset, events: list[tuple[float, str, int]],
           gap_s: float) -> list[tuple[float, str, int]]:
    """The events that open a visit: the user's rating comes more than `gap_s` after their
    previous rating (events keep their order). `gap_s` <= 0: every event."""
    if gap_s <= 0:
        return events
    return [(t, user, k) for t, user, k in events
            if ds.users[user][k].timestamp - ds.users[user][k - 1].timestamp > gap_s]


def _body(ds: Dataset, retriever, user, k: int, num_candidates: int, history_window: int,
          rng_key: list[int]) -> tuple[dict | None, bool]:
    """The /v1/rank body of `user`'s k-th review (None: fewer than two candidates) and
    whether the retriever found the reviewed item."""
    hist = ds.users[user]
    target = hist[k].item_id
    past = hist[:k][-history_window:]
    seen = {h.item_id for h in hist[:k]}
    short = retriever.shortlist(sorted(seen), num_candidates, seen - {target})
    hit = target in short
    if not hit:
        short = [*short[:num_candidates - 1], target]
    if len(short) < 2:
        return None, hit
    cands = [short[j] for j in np.random.default_rng(rng_key).permutation(len(short)).tolist()]
    return ({"user_id": str(user), "candidates": [str(c) for c in cands],
             "history": [{"item_id": str(h.item_id), "rating": h.rating, "review": h.review,
                          "timestamp": h.timestamp} for h in past]}, hit)


def review_trace(ds: Dataset, n: int, num_candidates: int = 20, history_window: int = 10,
                 seed: int = 0, window: str = "users", session_gap_s: float = 0.0) -> Trace:
    """`n` consecutive review events of `ds` (or visits, with `session_gap_s` > 0) as
    requests, the window chosen by `window` (module docstring)."""
    from ..eval.protocol import ItemKnnRetriever

    if n < 1:
        raise RcllmError("the trace needs at least one request")
    events = visits(ds, _events(ds, np.random.default_rng(seed)), session_gap_s)
    if not events:
        raise RcllmError(f"no rating comes more than {session_gap_s:g} s after the user's "
                         "previous one: no visit makes a request")
    start = window_start([e[1] for e in events], np.array([e[0] for e in events]), n, window)
    retriever = ItemKnnRetriever(ds)
    bodies, times, users, found, targets = [], [], [], [], []
    for t, user, k in events[start:start + n]:
        body, hit = _body(ds, retriever, user, k, num_candidates, history_window,
                          [seed, k, len(users)])
        if body is None:
            continue
        bodies.append(body)
        times.append(t)
        users.append(str(user))
        found.append(hit)
        targets.append(str(ds.users[user][k].item_id))
    if not bodies:
        raise RcllmError("no request of the trace has two candidates")
    return Trace(bodies, np.asarray(times), users, float(np.mean(found)), window,
                 float(max(0.0, session_gap_s)), tuple(targets))
