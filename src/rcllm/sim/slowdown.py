"""How much slower an engine computes beside the rest of a served cluster than the fit run timed
it: F of `sim/served.simulate_cell` (each request's engine work runs at 1/F of its speed alone
while two or more threads compute at once), per engine method with "*" for the rest.

Two ways to measure it, neither on the sweep being predicted:
- `busy_slowdown_from`: two `bench ttft` runs of the same requests, one alone, one with a second
  copy beside it (`rcllm sim sweep --busy-from`). It sees two engines sharing the machine's
  cores and memory, nothing of the served stack.
- `served_slowdown_from`: a *separate* served run (another `bench serve --sweep`, e.g. the short
  calibration cell of `scripts/reproduce_tables.sh`; `--served-from`): each answer's engine
  thread CPU (`thread_cpu_ms`) over the profile's price of the same tokens. On this machine the
  served engine's thread spends 2–6% more CPU per request than `bench ttft` prices the same
  prompt (median per sweep, nine sweeps of 2026-12-04/05) while two `bench ttft` copies side by
  side show 0.99–1.08x; the cause is not isolated. The CPU, not the wall time: the wait for a core is
  `simulate_cell`'s core sharing, and counting it here too would count it twice.

And from the same served run, the builder threads' CPU weight in that core sharing
(`served_builder_weight`, `--served-weight`), in place of CFS's weight of their niceness.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..errors import RcllmError


def _per_method(ratios: dict[str, list[float]]) -> dict[str, float]:
    out = {m: float(np.median(v)) for m, v in sorted(ratios.items())}
    out["*"] = float(np.median([x for v in ratios.values() for x in v]))
    return out


def busy_slowdown_from(alone: list[dict], shared: list[dict]
                       ) -> tuple[dict[str, float], int]:
    """F for `simulate_cell` from two `bench ttft` runs of the same requests: one alone on the
    machine, one while a second engine computed beside it (two copies started together).
    Per engine method (`method`: full, prefix, naive, epic, cacheblend, rcllm) the median over
    the requests both measured of shared / alone TTFT, and under "*" the median over all of
    them (what methods the runs did not measure get); and how many requests there were. The
    methods differ: a reuse method gathers and attends over stored KV and slows more when
    another engine shares the memory bus than a compute-bound full prefill does."""
    key = lambda r: (r.get("user_id"), r.get("variant", r["method"]))  # noqa: E731
    base = {key(r): r["ttft_ms"] for r in alone if "user_id" in r}
    ratios: dict[str, list[float]] = {}
    for r in shared:
        if key(r) in base and base[key(r)] > 0:
            ratios.setdefault(r["method"], []).append(r["ttft_ms"] / base[key(r)])
    if not ratios:
        raise RcllmError("--busy-from: the two runs share no request (same --data, "
                         "--requests and --seed, with and without a second engine beside)")
    return _per_method(ratios), sum(len(v) for v in ratios.values())


def served_slowdown_from(calibration: Mapping[str, Any], price: Callable[[str, int, int], float],
                         scale: Callable[[Mapping[str, Any]], float] = lambda cell: 1.0
                         ) -> tuple[dict[str, float], int]:
    """F for `simulate_cell` from a separate served run (`calibration`: its sweep.json): per
    engine method the median over its answered requests of the engine thread's CPU time over
    `price(method, computed tokens, context tokens)` (the profile the prediction uses) times
    `scale(cell)` (the cell's speed scale when the prediction scales its cells too), "*" over
    all of them; and how many requests there were."""
    ratios: dict[str, list[float]] = {}
    for c in calibration.get("cells") or []:
        k = scale(c)
        for r in c["requests"]:
            if r.get("status") == 200 and r.get("thread_cpu_ms") is not None:
                method = r.get("method") or "rcllm"
                cost = k * price(method, r["recomputed_tokens"], r["context_tokens"])
                if cost > 0:
                    ratios.setdefault(method, []).append(r["thread_cpu_ms"] / cost)
    if not ratios:
        raise RcllmError("--served-from: the run has no answered request with its engine "
                         "thread's CPU time (thread_cpu_ms: sweeps recorded since 2026-12-03)")
    return _per_method(ratios), sum(len(v) for v in ratios.values())


def same_run(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two sweep reports come from one run (a sweep.json and its sweep.partial.json
    included): the same start and the same first cell's arrivals."""
    ca, cb = (a.get("cells") or [{}])[0], (b.get("cells") or [{}])[0]
    return (a.get("start_s") == b.get("start_s")
            and ca.get("arrivals_s") == cb.get("arrivals_s")
            and [r.get("ttft_ms") for r in ca.get("requests", [])]
            == [r.get("ttft_ms") for r in cb.get("requests", [])])


def slowdown_of(busy_slowdown: float | Mapping[str, float], method: str) -> float:
    """A method's F: one number for every method, or per method with "*" for the rest."""
    if isinstance(busy_slowdown, Mapping):
        return float(busy_slowdown.get(method, busy_slowdown.get("*", 1.0)))
    return float(busy_slowdown)


def served_builder_weight(calibration: Mapping[str, Any],
                          engine_ms: Callable[[Mapping[str, Any], float], np.ndarray],
                          low: float = 1e-3, high: float = 1.0, steps: int = 30
                          ) -> tuple[float, int]:
    """The builder threads' CPU weight against an engine thread as a separate served run
    (`calibration`: its sweep.json) shows it: the weight at which `engine_ms(cell, weight)` —
    the simulator's engine time of each answered request of a calibration cell, replayed with
    that weight — sums to the engine time the run measured (its `ttft_ms`), over the cells
    where work was queued behind the answers (the others do not depend on it). Found by
    bisection in [`low`, `high`] (1: a builder weighs as much as an engine; `low` > 0, so a
    build always progresses); the bound when the measured time lies outside. Returns the
    weight and how many requests it rests on.

    Why measured here rather than taken from the builders' niceness (CFS's weight, 0.107 at
    nice 10): the served engines wait for a core 14–16% of their CPU time while their own
    build runs and 11–13% beside the other's (`scripts/served_wait.py` on two sweeps), where
    weighted sharing of two cores by two engines and a builder at CFS's weight gives 5%."""
    cells = [c for c in calibration.get("cells") or []
             if any(r.get("status") == 200 and r.get("behind_tokens") for r in c["requests"])]
    measured = sum(r["ttft_ms"] for c in cells for r in c["requests"] if r.get("status") == 200)
    n = sum(r.get("status") == 200 for c in cells for r in c["requests"])
    if not n:
        raise RcllmError("the served run queued no work behind its answers (no behind_tokens): "
                         "it cannot show the builders' weight")
    excess = lambda w: sum(float(np.sum(engine_ms(c, w))) for c in cells) - measured  # noqa: E731
    lo, hi = float(low), float(high)
    if excess(hi) <= 0:
        return hi, n
    if excess(lo) >= 0:
        return lo, n
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi), n
