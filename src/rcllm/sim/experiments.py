"""The paper's performance experiments, each a function from a workload to report rows.

Offered load is given relative to Prefix-Cache's capacity (`Scenario.load` = arrival rate ×
Prefix-Cache's mean service time / instances), so the same setting means the same pressure for
Qwen3-8B and Qwen-72B. Every experiment returns (rows, series): rows for the JSON/markdown
report, series (name → (x, y) lists) for the plot.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..routing.cost import CostModel, MethodConfig, RequestShape
from ..routing.profiles import SpeedProfile
from ..routing.registry import ITEM_POLICIES
from ..routing.views import ArrayLocality
from ..routing.vidur_fit import builtin_profile
from .engine import SimConfig, simulate
from .placement import build_locality
from .result import SimResult
from .workload import Workload, poisson_arrivals_ms

Series = dict[str, tuple[list[float], list[float]]]


@dataclass(frozen=True)
class Scenario:
    profile: str = "qwen3-8b@a100"
    placement: str = "community"
    hot_fraction: float = 0.001
    history_hit_rate: float = 0.93
    item_ratio: float = 0.3
    history_ratio: float = 0.3
    load: float = 0.7
    seed: int = 0

    def speed(self) -> SpeedProfile:
        """A built-in profile by name, or a profile file (`bench shapes --profile-out`,
        `serve --save-profile`) by path."""
        if self.profile.endswith(".json"):
            from ..routing.profiles import load_profile

            return load_profile(self.profile)
        return builtin_profile(self.profile)


def prefix_service_ms(workload: Workload, profile: SpeedProfile) -> float:
    """Mean Prefix-Cache service time of the workload's requests (no queueing)."""
    cost = CostModel(profile, MethodConfig("prefix"))
    ctx = workload.context_tokens()
    work = cost.work(RequestShape(workload.prefix_tokens, 0, 0, 0, 0), 0)
    return float(np.mean(cost.service_ms(replace(work, computed_tokens=ctx - work.reused_tokens,
                                                 context_tokens=ctx))))


def qps_for(workload: Workload, sc: Scenario, num_instances: int) -> float:
    return sc.load * num_instances * 1000.0 / prefix_service_ms(workload, sc.speed())


def locality_for(workload: Workload, sc: Scenario, k: int) -> ArrayLocality:
    return build_locality(workload, k, sc.placement, sc.hot_fraction, sc.seed)


def run_one(workload: Workload, sc: Scenario, k: int, method: str, qps: float,
            policy: str = "auto", ratios: tuple[float, float] | None = None,
            loc: ArrayLocality | None = None) -> SimResult:
    """One simulation; `loc` reuses a placement built for the same (workload, scenario, k)."""
    item_r, hist_r = ratios if ratios else (sc.item_ratio, sc.history_ratio)
    cfg = SimConfig(MethodConfig(method, item_r, hist_r), policy=policy,
                    history_hit_rate=sc.history_hit_rate, seed=sc.seed)
    loc = loc if loc is not None else locality_for(workload, sc, k)
    arrivals = poisson_arrivals_ms(np.random.default_rng(sc.seed + 1), workload.num_requests, qps)
    res = simulate(workload, arrivals, loc, sc.speed(), cfg)
    res.check_invariants()
    return res


def _cdf(ttft_ms: np.ndarray) -> tuple[list[float], list[float]]:
    q = np.linspace(0, 100, 101)
    return np.percentile(ttft_ms, q).tolist(), (q / 100).tolist()


def cdf_experiment(workload: Workload, sc: Scenario, k: int = 40) -> tuple[list[dict], Series]:
    """Figs 7–8: TTFT distribution of full / prefix / rcllm at k instances."""
    qps = qps_for(workload, sc, k)
    loc = locality_for(workload, sc, k)
    rows, series, base = [], {}, None
    for method in ("full", "prefix", "rcllm"):
        res = run_one(workload, sc, k, method, qps, loc=loc)
        s = res.summary()
        base = s if method == "prefix" else base
        rows.append({"method": method, "instances": k, "qps": qps, **s})
        series[method] = _cdf(res.ttft_ms)
    for row in rows:
        row["p50_speedup_vs_prefix"] = base["p50_ttft_ms"] / row["p50_ttft_ms"]
        row["p99_speedup_vs_prefix"] = base["p99_ttft_ms"] / row["p99_ttft_ms"]
    return rows, series


def scaling_experiment(workload: Workload, sc: Scenario,
                       ks: Sequence[int] = (1, 2, 5, 10, 20, 40, 70, 100)
                       ) -> tuple[list[dict], Series]:
    """Fig 10: P50/P99 speedup of rcllm over prefix as instances (and load) grow."""
    rows = []
    for k in ks:
        qps = qps_for(workload, sc, k)
        loc = locality_for(workload, sc, k)
        pre = run_one(workload, sc, k, "prefix", qps, loc=loc).summary()
        rc = run_one(workload, sc, k, "rcllm", qps, loc=loc).summary()
        rows.append({"instances": k, "qps": qps, "prefix_p50_ms": pre["p50_ttft_ms"],
                     "prefix_p99_ms": pre["p99_ttft_ms"], "rcllm_p50_ms": rc["p50_ttft_ms"],
                     "rcllm_p99_ms": rc["p99_ttft_ms"], "rcllm_hit_rate": rc["mean_item_hit_rate"],
                     "p50_speedup": pre["p50_ttft_ms"] / rc["p50_ttft_ms"],
                     "p99_speedup": pre["p99_ttft_ms"] / rc["p99_ttft_ms"]})
    xs = [float(r["instances"]) for r in rows]
    return rows, {"P50": (xs, [r["p50_speedup"] for r in rows]),
                  "P99": (xs, [r["p99_speedup"] for r in rows])}


def policy_experiment(workload: Workload, sc: Scenario, k: int = 10,
                      loads: Sequence[float] = (0.3, 0.5, 0.7, 0.9, 1.1, 1.3),
                      policies: Sequence[str] = ITEM_POLICIES
                      ) -> tuple[list[dict], Series]:
    """Fig 12: mean rcllm TTFT per routing policy over a request-rate sweep at k instances."""
    rows, series = [], {p: ([], []) for p in policies}
    loc = locality_for(workload, sc, k)
    for load in loads:
        qps = qps_for(workload, replace(sc, load=load), k)
        for pol in policies:
            s = run_one(workload, sc, k, "rcllm", qps, policy=pol, loc=loc).summary()
            rows.append({"policy": pol, "qps": qps, "load_vs_prefix": load, "instances": k,
                         "mean_ttft_ms": s["mean_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"],
                         "hit_rate": s["mean_item_hit_rate"],
                         "max_instance_share": s["max_instance_share"]})
            series[pol][0].append(qps)
            series[pol][1].append(s["mean_ttft_ms"])
    return rows, series


def ratio_experiment(workload: Workload, sc: Scenario, k: int = 40,
                     ratios: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
                     ) -> tuple[list[dict], Series]:
    """Fig 13: rcllm TTFT as the (item = history) recompute ratio grows."""
    qps = qps_for(workload, sc, k)
    loc = locality_for(workload, sc, k)
    rows = []
    for r in ratios:
        s = run_one(workload, sc, k, "rcllm", qps, ratios=(r, r), loc=loc).summary()
        rows.append({"ratio": r, "instances": k, "qps": qps, "p50_ttft_ms": s["p50_ttft_ms"],
                     "p90_ttft_ms": s["p90_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"],
                     "mean_ttft_ms": s["mean_ttft_ms"]})
    xs = [r["ratio"] for r in rows]
    return rows, {q: (xs, [r[f"{q.lower()}_ttft_ms"] for r in rows]) for q in ("P50", "P90", "P99")}


def shape_of(workload: Workload, i: int, history_hit_tokens: int) -> RequestShape:
    """The cost-model shape of request i (used by the routing benchmark)."""
    return RequestShape(workload.prefix_tokens, workload.fresh_tokens,
                        int(workload.history_tokens[i]), history_hit_tokens,
                        int(workload.item_tokens[workload.candidates[i]].sum()))
