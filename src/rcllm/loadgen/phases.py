"""The phases of `rcllm bench serve` after warm-up, each a load run with something done to the
deployment meanwhile: a Redis kill and restart, a long soak above capacity with the servers'
RSS sampled, an instance kill. Every phase returns `client.run_load`'s summary plus what the
phase itself observed.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .client import run_load


def rss_bytes(pid: int) -> int | None:
    """VmRSS of `pid` from /proc (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Samples the RSS of named processes every `interval_s` on a thread, from start() to
    stop(). Each server process is measured in itself. Growth is reported over the first
    sample and over the sample `settle_s` after start: an instance the warm-up never reached
    (affinity sent it nothing) warms up during the load, and that is not growth."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.5,
                 settle_s: float = 0.0) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.settle_s = settle_s
        self._t0 = time.monotonic()
        self.samples: dict[str, list[int]] = {name: [] for name in pids}
        self.times: dict[str, list[float]] = {name: [] for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            rss = rss_bytes(pid)
            if rss is not None:
                self.samples[name].append(rss)
                self.times[name].append(time.monotonic() - self._t0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> "RssSampler":
        self._t0 = time.monotonic()
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> dict[str, dict[str, float]]:
        """Per process: RSS at the start, peak and end (MiB) and growth of peak and end over
        the start."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        out = {}
        for name, xs in self.samples.items():
            if not xs:
                continue
            first = xs[0]
            k = next((i for i, t in enumerate(self.times[name]) if t >= self.settle_s), 0)
            settled, rest = xs[k], xs[k:]
            out[name] = {"start_mib": first / 2**20, "peak_mib": max(xs) / 2**20,
                         "end_mib": xs[-1] / 2**20, "growth_peak": max(xs) / first - 1,
                         "growth_end": xs[-1] / first - 1, "settle_s": self.times[name][k],
                         "settled_mib": settled / 2**20,
                         "growth_peak_after_settle": max(rest) / settled - 1,
                         "growth_end_after_settle": xs[-1] / settled - 1, "samples": len(xs)}
        return out


def during_load(url: str, bodies: list[dict], qps: float,
                events: list[tuple[float, Callable[[], object]]]) -> tuple[dict, list]:
    """Runs the load while calling each `(fraction, action)` once that fraction of the
    requests has been answered (any status), so an action always lands mid-load with the rest
    still to come, however slow the machine is (a fraction of the nominal duration did not: on
    a busy machine every action could fall before or after the requests it was meant for).
    Returns the load summary and the actions' results."""
    n = len(bodies)
    answered = [0]
    marks = sorted(events, key=lambda e: e[0])
    reached = [threading.Event() for _ in marks]

    def on_answer(_row: dict) -> None:
        answered[0] += 1
        for (fraction, _), ev in zip(marks, reached):
            if answered[0] >= max(1, int(fraction * n)):
                ev.set()

    out: dict = {}
    load = threading.Thread(target=lambda: out.update(run_load(url, bodies, qps,
                                                               on_answer=on_answer)),
                            name="bench-load", daemon=True)
    load.start()
    results = []
    for (_fraction, action), ev in zip(marks, reached):
        while not ev.wait(0.05):
            if not load.is_alive():          # the load ended first (it raised): stop waiting
                break
        results.append(action())
    load.join()
    return out, results


def redated(bodies: list[dict], days: int) -> list[dict]:
    """`bodies` with every history entry dated `days` later and its review marked so: new
    history chunks under either chunk style (`prompt.history_style`: a dated chunk starts with
    its date; a compact one has no date but its review text follows the name within a few
    tokens), so requests miss and store."""
    return [{**b, "history": [{**h, "timestamp": h["timestamp"] + 86_400 * days,
                               "review": f"(+{days}d) {h.get('review', '')}".rstrip()}
                              for h in b["history"]]} for b in bodies]


def redis_fault(url: str, bodies: list[dict], qps: float, redis, store_stats,
                retry_after_s: float = 1.0) -> dict:
    """Redis killed (SIGKILL) once a third of the requests are answered and restarted on its
    port at two thirds: requests must all be answered (misses recompute), and Redis written to
    again after the restart. Every history entry is dated a day later, so its chunk (which
    starts with the date) is new: the phase misses and stores, and so really talks to Redis (a
    workload served from memory would never notice the kill; changing the review text was not
    enough, the chunk's `prompt.max_review_tokens` are mostly date, rating and title). After
    the load, once the client's retry window (`retry_after_s`) has passed, the last third is
    sent again dated two days later (`after_restart`): its new chunks are written to the
    restarted server whatever the timing of the load was."""
    from ..kvstore.redis_server import RedisServer

    bodies = redated(bodies, 1)

    def tier(name: str) -> dict:
        return store_stats().get(name, {})

    # Each action returns the tier's counters read *before* it acts: read after the kill, they
    # could already hold the outage's first error, and with the circuit open for
    # `retry_after_s` an outage shorter than that on one instance counts no second one (the
    # phase then reported 0 errors though a request had failed to reach Redis).
    def kill():
        before = dict(tier("redis"))
        redis.stop()
        return before

    def restart():
        before = dict(tier("redis"))
        fresh = RedisServer(redis.port).start()
        redis.proc = fresh.proc
        return before

    res, (at_kill, at_restart) = during_load(url, bodies, qps, [(1 / 3, kill), (2 / 3, restart)])
    time.sleep(retry_after_s + 0.2)     # the circuit breaker closes again
    again = run_load(url, redated(bodies[-max(1, len(bodies) // 3):], 1), qps)
    res["after_restart"] = {k: again[k] for k in ("sent", "ok", "statuses", "failed")}
    wait_until_stored(store_stats)
    time.sleep(1.0)     # write-behind of the last requests
    end = tier("redis")
    res["redis_errors"] = end.get("errors", 0) - at_kill.get("errors", 0)
    res["redis_puts_after_restart"] = end.get("put_count", 0) - at_restart.get("put_count", 0)
    res["redis_entries"] = end.get("entries", 0)
    return res


def wait_until_stored(store_stats, timeout_s: float = 120.0) -> bool:
    """Blocks until no instance has chunk builds queued or running (the misses of the
    requests answered so far are built behind their answers, kvstore/front.py) nor writes to
    the lower tiers queued (write-behind: until written, another instance cannot find the
    entry in the shared Redis tier), so the next phase finds them; False when `timeout_s`
    passed first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        front = store_stats().get("all", {})
        if front.get("build_queue", 0) == 0 and front.get("write_pending", 0) == 0:
            return True
        time.sleep(0.1)
    return False


def instance_fault(url: str, bodies: list[dict], qps: float, backend, index: int) -> dict:
    """Instance `index` killed once a third of the requests are answered: every request is
    answered by the others."""

    def kill():
        backend.kill_instance(index)
        return time.perf_counter()

    res, _ = during_load(url, bodies, qps, [(1 / 3, kill)])
    res["killed_instance"] = index
    res["router_retries"] = backend.retries
    return res


def soak(url: str, bodies: list[dict], qps: float, seconds: float, pids: dict[str, int],
         warm_s: float | None = None) -> dict:
    """Open-loop load at `qps` for `warm_s` (default a fifth of `seconds`, at most 120 s),
    then for `seconds` with every server process's RSS sampled (the workload's bodies
    cycled). The soak's own warm-up is needed because the workload's warm-up does not reach
    every instance (affinity sends a light load to one): an instance first loaded here fills
    its caches now, and that is not growth. Growth is also reported over the RSS a fifth of
    the way in (RssSampler)."""
    warm_s = min(120.0, seconds / 5) if warm_s is None else warm_s

    def cycled(n: int) -> list[dict]:
        return [bodies[k % len(bodies)] for k in range(max(1, n))]

    warm = run_load(url, cycled(int(qps * warm_s)), qps, timeout_s=300.0) if warm_s else None
    sampler = RssSampler(pids, settle_s=min(120.0, seconds / 5)).start()
    res = run_load(url, cycled(int(qps * seconds)), qps, timeout_s=300.0)
    res["rss"] = sampler.stop()
    res["rss_growth_peak_max"] = max((r["growth_peak"] for r in res["rss"].values()), default=0)
    res["rss_growth_peak_after_settle_max"] = max(
        (r["growth_peak_after_settle"] for r in res["rss"].values()), default=0)
    if warm is not None:
        res["warmup"] = {k: warm[k] for k in ("sent", "statuses", "failed", "wall_s")}
    return res
