"""`rcllm bench checkpoints`, planner part: recurrent-work reduction of DP vs the baselines.

For each workload, the DP plans on a histogram of `train_requests` sampled past requests (what a
server would have); every schedule is then scored under the workload's true distribution.
`dp_oracle` plans on the true distribution and bounds what more history could buy. No torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import RcllmError
from ..checkpoints.baselines import BASELINES, block
from ..checkpoints.distributions import WORKLOADS, overlap_histogram, sample_depths, workload
from ..checkpoints.planner import expected_depth, expected_recompute, plan_budgets, plan_optimal

METHODS = ("dp", "dp_oracle", "balanced", "block", "log", "sqrt")


@dataclass(frozen=True)
class CheckpointBenchConfig:
    n: int = 8192                 # prefix length for the planner sweep
    max_budget: int = 32          # budgets M = 1..max_budget
    workloads: str = "long_doc,system_prompt,multimodal,uniform"
    train_requests: int = 2000    # past requests the DP's histogram is built from
    half_life: float = 0.0        # > 0: exponentially weighted histogram (drift)
    block_tokens: int = 256       # the fixed-block baseline's block size
    speed_n: int = 100_000        # planner speed check: N ...
    speed_m: int = 64             # ... and M
    model_n: int = 2048           # recurrent-model prefix length (0 skips the model part)
    model_budget: int = 4         # checkpoints per schedule in the model part
    model_requests: int = 24      # timed requests per workload
    model_workloads: str = "long_doc,system_prompt,uniform"
    model_schedules: str = "dp,balanced,block"
    threads: int = 1              # torch CPU threads for the model part
    seed: int = 0

    def workload_list(self, field: str = "workloads") -> list[str]:
        names = [w.strip() for w in getattr(self, field).split(",") if w.strip()]
        unknown = [w for w in names if w not in WORKLOADS]
        if unknown or not names:
            raise RcllmError(f"{field} must list workloads from {', '.join(WORKLOADS)}")
        return names

    def validate(self) -> None:
        if self.n < 1 or self.max_budget < 1 or self.train_requests < 1:
            raise RcllmError("n, max_budget and train_requests must be >= 1")
        if self.model_n < 0 or self.model_budget < 1 or self.model_requests < 1:
            raise RcllmError("model_n must be >= 0; model_budget and model_requests >= 1")
        self.workload_list()
        self.workload_list("model_workloads")
        bad = [s for s in self.model_schedules.split(",") if s.strip() not in METHODS]
        if bad:
            raise RcllmError(f"model_schedules must come from {', '.join(METHODS)}")


def schedule_for(method: str, n: int, m: int, history: np.ndarray, truth: np.ndarray,
                 cfg: CheckpointBenchConfig) -> tuple[int, ...]:
    """Positions of one method at budget m (DP variants plan on history / truth)."""
    if method == "dp":
        return plan_optimal(history, n, m).positions
    if method == "dp_oracle":
        return plan_optimal(truth, n, m).positions
    if method == "block":
        return block(n, m, cfg.block_tokens)
    return BASELINES[method](n, m)


def history_for(truth: np.ndarray, n: int, cfg: CheckpointBenchConfig,
                rng: np.random.Generator) -> np.ndarray:
    depths = sample_depths(truth, cfg.train_requests, rng)
    return overlap_histogram(depths, n, cfg.half_life if cfg.half_life > 0 else None)


def planner_rows(cfg: CheckpointBenchConfig, rng: np.random.Generator) -> list[dict[str, Any]]:
    """One row per (workload, budget, method); see docs/checkpoints.md for the keys."""
    rows = []
    n = cfg.n
    for name in cfg.workload_list():
        truth = workload(name, n)
        history = history_for(truth, n, cfg, rng)
        no_cache = expected_depth(truth, n)
        planned = {"dp": plan_budgets(history, n, cfg.max_budget),
                   "dp_oracle": plan_budgets(truth, n, cfg.max_budget)}
        for m in range(1, cfg.max_budget + 1):
            costs = {}
            for method in METHODS:
                pos = (planned[method][m - 1].positions if method in planned
                       else schedule_for(method, n, m, history, truth, cfg))
                costs[method] = (expected_recompute(pos, truth, n), len(pos))
            for method, (cost, used) in costs.items():
                rows.append({
                    "part": "planner", "workload": name, "budget": m, "method": method,
                    "checkpoints": used, "expected_recompute_tokens": cost,
                    "no_cache_tokens": no_cache,
                    "reduction_factor": no_cache / cost if cost > 0 else float("inf"),
                    "dp_advantage": cost / costs["dp"][0] if costs["dp"][0] > 0 else float("nan"),
                })
    return rows


def planner_speed(cfg: CheckpointBenchConfig, repeats: int = 3) -> dict[str, Any]:
    """Wall time of the DP at speed_n, speed_m on a dense distribution (every depth has mass).

    Best of `repeats` runs (the machine is shared; the minimum is the least disturbed run),
    with the median alongside.
    """
    p = 0.5 * workload("multimodal", cfg.speed_n) + 0.5 / (cfg.speed_n + 1)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sched = plan_optimal(p, cfg.speed_n, cfg.speed_m)
        times.append(time.perf_counter() - start)
    return {"planner_n": cfg.speed_n, "planner_m": cfg.speed_m, "planner_s": min(times),
            "planner_s_median": float(np.median(times)), "planner_checkpoints": len(sched.positions)}


def planner_summary(rows: list[dict[str, Any]], cfg: CheckpointBenchConfig) -> dict[str, Any]:
    """Per workload: DP reduction at a few budgets and DP's advantage over each baseline."""
    out: dict[str, Any] = {}
    for name in cfg.workload_list():
        mine = [r for r in rows if r["workload"] == name]
        for m in sorted({1, 4, 8, cfg.max_budget} & set(range(1, cfg.max_budget + 1))):
            dp = next(r for r in mine if r["budget"] == m and r["method"] == "dp")
            out[f"{name}.dp_reduction_m{m}"] = dp["reduction_factor"]
        for method in ("balanced", "block", "log", "sqrt", "dp_oracle"):
            adv = [r["dp_advantage"] for r in mine if r["method"] == method]
            out[f"{name}.dp_advantage_vs_{method}_max"] = max(adv)
            out[f"{name}.dp_advantage_vs_{method}_mean"] = float(np.mean(adv))
    return out


def table_rows(rows: list[dict[str, Any]], budgets: tuple[int, ...]) -> list[dict[str, Any]]:
    """Wide rows for the markdown table: reduction factor per method, DP vs best baseline."""
    out = []
    keys = sorted({(r["workload"], r["budget"]) for r in rows if r["budget"] in budgets},
                  key=lambda k: (rows.index(next(r for r in rows if r["workload"] == k[0])), k[1]))
    for name, m in keys:
        cell = {r["method"]: r for r in rows if r["workload"] == name and r["budget"] == m}
        wide = {"workload": name, "M": m}
        wide.update({method: cell[method]["reduction_factor"] for method in METHODS})
        best = min(cell[b]["expected_recompute_tokens"] for b in ("balanced", "block", "log", "sqrt"))
        dp = cell["dp"]["expected_recompute_tokens"]
        wide["dp_vs_best_baseline"] = best / dp if dp > 0 else float("inf")
        out.append(wide)
    return out
