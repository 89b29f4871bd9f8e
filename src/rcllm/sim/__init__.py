"""Discrete-event simulation of an rcllm cluster (no torch; a layering test checks).

`simulate(workload, arrivals_ms, locality, profile, SimConfig(...))` runs requests through K
instances routed by a `rcllm.routing` policy and priced by its cost model.
"""

from .engine import SimConfig, simulate
from .placement import build_locality
from .result import SimResult
from .workload import SyntheticSpec, Workload, poisson_arrivals_ms, synthetic_workload

__all__ = ["SimConfig", "simulate", "build_locality", "SimResult", "SyntheticSpec", "Workload",
           "poisson_arrivals_ms", "synthetic_workload"]
