"""The served cluster's event loop, for the simulator's prediction of a served sweep
(`served.simulate_engine` prices the requests and runs them here).

K instances, each an engine serving a FIFO queue one request at a time beside a builder thread
that runs the jobs its answers queued behind them, one at a time; the busy threads share the
machine's cores by CPU weight (`core_shares`) and slow each other by the busy slowdown F.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..routing.registry import REGISTRY


def core_shares(weights: list[float], cores: float) -> list[float]:
    """Each runnable thread's speed (fraction of one core) when threads of these CPU weights
    share `cores` (weighted processor sharing: a thread never runs faster than one core; what
    a capped thread cannot use goes to the others by weight)."""
    if len(weights) <= cores:
        return [1.0] * len(weights)
    rates, left, free = [0.0] * len(weights), float(cores), set(range(len(weights)))
    while free:
        lam = left / sum(weights[i] for i in free)
        capped = [i for i in free if lam * weights[i] >= 1.0]
        if not capped:
            for i in free:
                rates[i] = lam * weights[i]
            break
        for i in capped:
            rates[i], left = 1.0, left - 1.0
            free.discard(i)
    return rates


class ServedCluster:
    """`simulate_engine`'s state between events, at time `t` (ms): per instance a FIFO queue
    of job indices, the job in service and its work left (ms at full speed), and a builder
    running the jobs queued behind its answers one at a time (its work left in `bleft`);
    `nxt` is the next job to arrive, `done`/`began` each job's end and start of service."""

    def __init__(self, jobs: list[tuple], instances: int, cores: float | None,
                 builder_weight: float, f_behind: float) -> None:
        self.jobs, self.k, self.cores = jobs, instances, cores
        self.builder_weight, self.f_behind = builder_weight, f_behind
        self.queues: list[deque] = [deque() for _ in range(instances)]
        self.left = [0.0] * instances
        self.serving: list[int | None] = [None] * instances
        self.behind: list[deque] = [deque() for _ in range(instances)]
        self.bleft = [0.0] * instances
        self.building = [False] * instances
        self.done = [0.0] * len(jobs)
        self.began = [0.0] * len(jobs)
        self.t, self.nxt = 0.0, 0

    def pending(self) -> bool:
        return (self.nxt < len(self.jobs) or any(j is not None for j in self.serving)
                or any(self.building))

    def start(self, d: int) -> None:
        if self.serving[d] is None and self.queues[d]:
            self.serving[d] = self.queues[d].popleft()
            self.left[d] = self.jobs[self.serving[d]][1]
            self.began[self.serving[d]] = self.t

    def start_behind(self, d: int) -> None:
        if not self.building[d] and self.behind[d]:
            self.building[d], self.bleft[d] = True, self.behind[d].popleft()

    def speeds(self) -> tuple[dict[int, float], dict[int, float]]:
        """The speed now (of one thread alone) of each busy engine and of each busy builder,
        by instance: 1/F while two or more threads compute, times its share of the cores."""
        busy = [d for d in range(self.k) if self.serving[d] is not None]
        builders = [d for d in range(self.k) if self.building[d]]
        threads = len(busy) + len(builders)
        shares = (core_shares([1.0] * len(busy) + [self.builder_weight] * len(builders),
                              self.cores)
                  if self.cores and threads else [1.0] * threads)

        def speed(f: float, share: float) -> float:
            return (1.0 if threads <= 1 else 1.0 / f) * share

        run = {d: speed(self.jobs[self.serving[d]][4], sh) for d, sh in zip(busy, shares)}
        brun = {d: speed(self.f_behind, sh) for d, sh in zip(builders, shares[len(busy):])}
        return run, brun

    def advance(self, run: dict[int, float], brun: dict[int, float]) -> float:
        """Runs every busy thread to the next event (the first to finish, or the next
        arrival); returns the next arrival's time."""
        t_done = min([self.t + self.left[d] / run[d] for d in run]
                     + [self.t + self.bleft[d] / brun[d] for d in brun], default=np.inf)
        t_next = self.jobs[self.nxt][0] if self.nxt < len(self.jobs) else np.inf
        now = min(t_done, t_next)
        for d in run:
            self.left[d] -= (now - self.t) * run[d]
        for d in brun:
            self.bleft[d] -= (now - self.t) * brun[d]
        self.t = now
        return t_next

    def complete(self, run: dict[int, float], brun: dict[int, float]) -> None:
        """Ends what finished now: a builder takes its next job; an engine's request is done,
        its behind jobs join the builder's queue, and the engine takes the next request."""
        for d in brun:
            if self.bleft[d] <= 1e-9:
                self.building[d] = False
                self.start_behind(d)
        for d in run:
            if self.left[d] <= 1e-9:
                self.done[self.serving[d]] = self.t
                self.behind[d].extend(self.jobs[self.serving[d]][3])
                self.serving[d] = None
                self.start(d)
                self.start_behind(d)

    def destination(self, own: bool, policy: str) -> int:
        """Where the arriving job goes: replayed, or the choice of cache-blind `policy`
        (`registry.CACHE_BLIND`): by arrival order, or by load."""
        if not own:
            return self.jobs[self.nxt][2]
        if REGISTRY[policy].reads == "order":
            return self.nxt % self.k
        # least outstanding work: what is left in service plus the queue
        return int(np.argmin([self.left[d] * (self.serving[d] is not None)
                              + sum(self.jobs[q][1] for q in self.queues[d])
                              for d in range(self.k)]))

    def arrive(self, dest: int) -> None:
        self.queues[dest].append(self.nxt)
        self.start(dest)
        self.nxt += 1
