"""The map (`rcllm sim map`, issue 62 item 3): where cache-aware routing pays, and where it loses.

Grid: instances × per-instance item budget (a share of a synthetic catalogue's item tokens, its
popularity tail fitted on a real one: `traces.zipf_alpha`) × placement (METIS or random shards,
`placement.build_locality`) × fast path (overlap@0.15, naive, late@5) with the user side cached
or not × routing policy (`routing.registry`). Per cell: P99 and goodput per policy at one rate,
item hit ratios, METIS against random; at 40 instances the paper's band (rcllm's P99 against
Prefix-Cache's).

Which simulator: the engine simulator's queueing (`engine.simulate` with one request per batch:
a FIFO server per instance, service known at routing, TTFT = arrival to end of service, here
as Lindley's recursion) and its policy objects, on the cache replay's store rule
(`served_stores.StoreSim`: an item store per instance, least recently used by bytes, a miss
stored once its request runs), vectorised over 100k items (`ItemCaches`; an over-full store
drops its oldest 1% at once). Both parts were checked on served cells (docs/sim-served.md):
the FIFO queueing on measured engine times (16 of 16 sub-capacity cells within 15%), the LRU
stores' hit ratios (15 of 15 at ¼, 5 of 5 at 1/16 without imports). The stores and the loop
are `map_caches.py`; the read-outs (gains, headline, markdown, PNG) `map_report.py`. What does not carry over:
the served instances share one machine's two cores (the slowdown F, the builders' weight: here
one instance = one accelerator, builds behind the answer free, no imports); sizes beyond those
measured (2 instances, a 1,682-item catalogue); the price of a request, which is not a fitted
profile but the measured speed-ups of finetune.md (`PATHS`), linear in missed item tokens.

Rate: per cell, load × the cluster's load-only capacity: a probe run of load-only at the
all-hit capacity gives load-only's mean service S, and every policy then runs at load · K / S
on the same arrival gaps (common random numbers). The first max(`warmup`, 5 K) requests are
not counted. Stores start where each router leaves them in the long run: a router that reads
items from the placement (hot items, its shard, then the most popular, while the budget
lasts), a blind one (load-only) from one LRU store fed the placement trace (`ItemCaches.steady`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from fractions import Fraction

import numpy as np

from ..errors import RcllmError
from ..routing.cost import CostModel, MethodConfig
from ..routing.profiles import MODELS, SpeedProfile
from ..routing.registry import ITEM_POLICIES, REGISTRY, check_policy
from .map_caches import ItemCaches, serve
from .placement import build_locality
from .workload import SyntheticSpec, Workload, synthetic_workload

log = logging.getLogger(__name__)

# MovieLens 100K, the adapters' pointwise prompt, one thread (finetune.md "Held-out, per path"):
FULL_MS = 1106.0           # full's TTFT p50
ITEM_FULL_MS = 32.4        # one item through every layer: overlap@0.15's miss (27.5 ms, issue 62:
                           # 25-30 ms, 7-8% of a ~380 ms request) / the 0.85 of layers it adds
# path: (speed-up over full with the user side from reused chunks, with it cached,
#        share of an item's full compute a miss adds)
PATHS = {"overlap@0.15": (2.84, 3.51, 0.85),      # rcllm overlap 0.15/0.15 (MovieLens)
         "naive": (4.05, 4.05 * 4.90 / 4.20, 1.0),  # cached: Magazine's cached/miss ratio
         "late@5": (1.45, 1.52, 5 / 30)}          # a miss computes the 5 lowest of 30 layers
PREFIX_SPEEDUP = 1.04      # Prefix-Cache on the pointwise prompt (engine.md): the instruction only
USER_SIDES = ("miss", "cached")
PLACEMENTS = {"metis": "metis", "random": "hash"}


@dataclass(frozen=True)
class MapSpec:
    """The grid; lists are comma-separated (`--set instances=2,10`)."""

    instances: str = "2,4,10,40,100"
    budgets: str = "1/4,1/8,1/16,1/32,1/64"     # of the catalogue's item tokens, per instance
    policies: str = "load-only,affinity,cost"
    placements: str = "metis,random"
    paths: str = "overlap@0.15,naive,late@5"
    user_sides: str = "miss,cached"
    tails: str = "movielens=1.23,magazine=0.75"  # name=alpha or name=PATH:FORMAT[:CATEGORY]
    items: int = 100_000
    requests: int = 600         # measured per cell
    warmup: int = 200           # run before them, not counted
    load: float = 0.8           # of the cluster's load-only capacity
    slo_factor: float = 3.0     # goodput: TTFT <= slo_factor x the path's all-hit service
    band_instances: int = 40
    hot_fraction: float = 0.001
    seed: int = 0

    def lists(self) -> dict:
        return {"instances": [int(x) for x in _split(self.instances)],
                "budgets": [Fraction(x) for x in _split(self.budgets)],
                "policies": _split(self.policies), "placements": _split(self.placements),
                "paths": _split(self.paths), "user_sides": _split(self.user_sides)}

    def validate(self) -> None:
        try:
            g = self.lists()
        except (ValueError, ZeroDivisionError) as exc:
            raise RcllmError(f"map: instances must be integers and budgets fractions ({exc})")
        for key, values in g.items():
            if not values:
                raise RcllmError(f"map: {key} is empty")
        if min(g["instances"]) < 1 or not all(0 < b <= 1 for b in g["budgets"]):
            raise RcllmError("map: instances must be >= 1 and budgets within (0, 1]")
        for name, known in (("placements", PLACEMENTS), ("paths", PATHS),
                            ("user_sides", USER_SIDES)):
            bad = [v for v in g[name] if v not in known]
            if bad:
                raise RcllmError(f"map: unknown {name} {bad[0]!r}; known: {', '.join(known)}")
        for p in g["policies"]:
            if check_policy(p) not in ITEM_POLICIES:
                raise RcllmError(f"map: {p} routes by what the map's requests do not carry "
                                 f"({REGISTRY[p].reads}); it can run "
                                 f"{', '.join(ITEM_POLICIES)}")
        if "load-only" not in g["policies"]:
            raise RcllmError("map: the policies must include load-only (the rate and the "
                             "1.3x comparison are against it)")
        if self.items < 400 or self.requests < 10 or self.warmup < 0:
            raise RcllmError("map: items >= 400, requests >= 10 and warmup >= 0")
        if not 0 < self.load < 1 or self.slo_factor <= 1:
            raise RcllmError("map: load must be within (0, 1) and slo_factor > 1")
        for item in _split(self.tails) or [""]:
            name, _, value = item.partition("=")
            if not name or not value:
                raise RcllmError(f"map: tails take name=alpha or name=PATH:FORMAT, not {item!r}")


def _split(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def tails(spec: MapSpec) -> dict[str, float]:
    """name → Zipf exponent: a number, or fitted on `PATH:FORMAT[:CATEGORY]`
    (`traces.popularity_of`)."""
    out = {}
    for item in _split(spec.tails):
        name, _, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            from .traces import popularity_of
            out[name] = popularity_of(value)["alpha"]
        if out[name] <= 0:
            raise RcllmError(f"map: tail {name}'s alpha must be > 0")
    return out


def path_costs(path: str, user_side: str, mean_item_tokens: float) -> tuple[float, float]:
    """(all-hit service ms, ms per missed item token) of a named path."""
    miss_speedup, cached_speedup, share = PATHS[path]
    base = FULL_MS / (cached_speedup if user_side == "cached" else miss_speedup)
    return base, share * ITEM_FULL_MS / mean_item_tokens


def path_cost_model(base_ms: float, per_token_ms: float) -> CostModel:
    """A cost model pricing a request exactly base + per_token x missed item tokens (the
    request's shape is its item tokens alone; reuse and transfer free): the router's estimate
    and the service are one price, as in the engine simulator."""
    prof = SpeedProfile("map", MODELS["smollm2-135m"], base_ms, per_token_ms, 0.0,
                        host_bytes_per_s=float("inf"), overlap_fraction=1.0)
    return CostModel(prof, MethodConfig("rcllm", 0.0, 0.0))


@dataclass(frozen=True)
class Cell:
    """One (tail, instances, placement, budget, path, user side) of the grid."""

    tail: str
    instances: int
    placement: str
    budget: Fraction
    path: str
    user_side: str

    def key(self) -> dict:
        return {**asdict(self), "budget": str(self.budget)}


def start_for(policy: str, starts: dict[str, ItemCaches]) -> ItemCaches:
    """A fresh copy of where `policy`'s stores start: the placement's for a router that reads
    items (it keeps them where the placement put them), the stream's steady state for one
    blind to them (`ItemCaches.steady`)."""
    return starts["blind" if REGISTRY[policy].reads in ("order", "load") else "items"].copy()


def warmup_of(spec: MapSpec, k: int) -> int:
    return max(spec.warmup, 5 * k)          # at least five requests per instance's queue


def run_cell(cell: Cell, w: Workload, gaps: np.ndarray, starts: dict[str, ItemCaches],
             spec: MapSpec, policies: list[str]) -> list[dict]:
    """Every policy at one rate: `load` × the cluster's load-only capacity, found by a probe
    run of load-only at the all-hit capacity (its mean service S: rate = load · K / S)."""
    base, per_token = path_costs(cell.path, cell.user_side, float(w.item_tokens.mean()))
    cost, slo = path_cost_model(base, per_token), spec.slo_factor * base
    k, warm = cell.instances, warmup_of(spec, cell.instances)
    arrivals = gaps[:warm + spec.requests]
    probe = serve(w, arrivals * base / (spec.load * k), start_for("load-only", starts), cost,
                  "load-only", warm, slo)
    rate = spec.load * k * 1000.0 / probe["mean_service_ms"]
    rows = []
    for pol in policies:
        run = start_for(pol, starts)
        s = serve(w, arrivals * 1000.0 / rate, run, cost, pol, warm, slo)
        run.check_invariants()
        rows.append({**cell.key(), "policy": pol, "rate_rps": rate, "base_ms": base,
                     "miss_item_ms": per_token * float(w.item_tokens.mean()), "slo_ms": slo,
                     "turnover": run.inserted / max(1.0, float(run.held.sum())), **s})
    return rows


def band_rows(cell: Cell, w: Workload, gaps: np.ndarray, starts: dict[str, ItemCaches],
              spec: MapSpec, policies: list[str], prefix: dict) -> list[dict]:
    """The paper's band at `band_instances`: rcllm's path under each policy at the rate that
    loads Prefix-Cache (its constant price, load-only) to `load`; `prefix` is that run."""
    base, per_token = path_costs(cell.path, cell.user_side, float(w.item_tokens.mean()))
    cost, warm = path_cost_model(base, per_token), warmup_of(spec, cell.instances)
    rows = []
    for pol in policies:
        s = serve(w, gaps[:warm + spec.requests] * 1000.0 / prefix["rate_rps"],
                  start_for(pol, starts), cost, pol, warm, spec.slo_factor * base)
        rows.append({**cell.key(), "policy": pol, "rate_rps": prefix["rate_rps"],
                     "rcllm_p99_ms": s["p99_ms"], "prefix_p99_ms": prefix["p99_ms"],
                     "item_hit": s["item_hit"], "p99_speedup": prefix["p99_ms"] / s["p99_ms"]})
    return rows


def prefix_run(w: Workload, gaps: np.ndarray, starts: dict[str, ItemCaches], spec: MapSpec,
               k: int) -> dict:
    """Prefix-Cache at `band_instances` under load-only (its cached part, the instruction, is
    on every instance: prefix-aware routing reduces to load-only) at `load` of its capacity."""
    price, warm = FULL_MS / PREFIX_SPEEDUP, warmup_of(spec, k)
    rate = spec.load * k * 1000.0 / price
    s = serve(w, gaps[:warm + spec.requests] * 1000.0 / rate, start_for("load-only", starts),
              path_cost_model(price, 0.0), "load-only", warm, spec.slo_factor * price)
    return {**s, "rate_rps": rate}


def workload_for(spec: MapSpec, alpha: float) -> Workload:
    """The synthetic catalogue (`workload.synthetic_workload`) with the tail's exponent,
    requests enough for the largest cluster's warm-up."""
    n = warmup_of(spec, max(spec.lists()["instances"])) + spec.requests
    return synthetic_workload(SyntheticSpec(num_items=spec.items, zipf_alpha=alpha,
                                            num_requests=n, seed=spec.seed,
                                            num_communities=min(400, spec.items // 50)))


def cells_per_tail(spec: MapSpec) -> int:
    g = spec.lists()
    return (len(g["instances"]) * len(g["placements"]) * len(g["budgets"]) * len(g["paths"])
            * len(g["user_sides"]))


def _tail(spec: MapSpec, tail: str, alpha: float, bar) -> tuple[list[dict], list[dict]]:
    g, w = spec.lists(), workload_for(spec, alpha)
    pop = np.bincount(w.placement_requests.ravel(), minlength=w.num_items)
    gaps = np.cumsum(np.random.default_rng(spec.seed + 1).exponential(1.0, w.num_requests))
    budget = {b: float(b) * float(w.item_tokens.sum()) for b in g["budgets"]}
    steady = {b: ItemCaches.steady(w.placement_requests, w.item_tokens, budget[b], 1)
              for b in g["budgets"]}
    rows, band = [], []
    for k in g["instances"]:
        for placement in g["placements"]:
            loc = build_locality(w, k, PLACEMENTS[placement], spec.hot_fraction, spec.seed)
            banded = k == spec.band_instances and placement == g["placements"][0]
            prefix = None
            for b in g["budgets"]:
                blind = steady[b]
                starts = {"items": ItemCaches.from_placement(loc, pop, w.item_tokens, budget[b]),
                          "blind": ItemCaches(np.repeat(blind.held, k, 0),
                                              np.repeat(blind.last, k, 0), w.item_tokens,
                                              budget[b])}
                prefix = prefix or (prefix_run(w, gaps, starts, spec, k) if banded else None)
                for path in g["paths"]:
                    for side in g["user_sides"]:
                        cell = Cell(tail, k, placement, b, path, side)
                        rows += run_cell(cell, w, gaps, starts, spec, g["policies"])
                        if banded:
                            band += band_rows(cell, w, gaps, starts, spec, g["policies"], prefix)
                        bar.update()
    return rows, band


def run_map(spec: MapSpec, progress: bool = True) -> dict:
    """The whole grid: {"rows": per cell and policy, "band": the band check's rows,
    "alphas": each tail's exponent}."""
    from tqdm import tqdm

    spec.validate()
    alphas = tails(spec)
    rows, band = [], []
    with tqdm(total=len(alphas) * cells_per_tail(spec), unit="cell", disable=not progress) as bar:
        for tail, alpha in alphas.items():
            r, b = _tail(spec, tail, alpha, bar)
            rows, band = rows + r, band + b
            log.info("map: tail %s (alpha %.3f) done", tail, alpha)
    return {"rows": rows, "band": band, "alphas": alphas}


QUICK = {"instances": "2,10", "budgets": "1/16,1/64", "paths": "overlap@0.15",
         "user_sides": "miss", "tails": "movielens=1.23", "items": 20_000, "requests": 300,
         "warmup": 100, "band_instances": 10}


def quick(spec: MapSpec) -> MapSpec:
    """`--quick`: a small grid (seconds), for a first look and the tests."""
    return replace(spec, **QUICK)
