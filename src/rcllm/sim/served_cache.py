"""The served sweep predicted with its caches and its router (`rcllm sim sweep --routing
caches`; issue 51 item 4).

`served.py` replays where each request went and what it computed; here both are predicted. The
sweep gives the workload only: the placement (each instance's items in build order), the
warm-up's requests, and per cell the arrival times and, per answered request, its user,
candidates, reviewed history items and token counts. Nothing of what the caches or the router
did is read, except to compare.

Model, per instance (a sweep without a shared tier; one with Redis is refused):
- two chunk stores, each least-recently-used by bytes (`launch.make_stored_engine` splits the
  memory so): item chunks (an item's tokens × the model's KV bytes per token) under the sweep's
  `reuse.store_bytes`, and history chunks (a user's review of an item, dated per cell as the
  sweep redates its trace; the row's history tokens split evenly over its chunks) under its
  `history_bytes` (serve's 1 GiB in sweeps that did not record it). The item store starts as
  the placement built it (items in build order, the store keeping the last ones that fit);
  then both take the warm-up's requests where they went.
- the router: the sweep's policy object (`routing.policies`) on the router's own cost model
  (the profile the sweep was routed with, a separate calibration run, when its file is
  there), reading its own picture of each instance's items and the estimates of the work it
  sent and was not yet answered, as `serve/views.LiveInstance` keeps them: the picture is
  what the store kept of the placement, then at each answer what the store holds and the
  request's candidates, stale in between (imports and evictions land unseen until then).
- imports: without a shared tier the router has items a chosen instance lacks and another
  holds exported by the owner and stored at the chosen one before it ranks (`serve/router.py
  _imports`), when the cost model prices fetching below recomputing. The export waits for the
  owner's engine: the import is ready when the owner's current request ends, plus the
  transfer at the profile's network bandwidth. When the chosen instance starts the request
  it waits for a late import at most what the import saves (recompute minus fetch); beyond
  that the items are not stored there and count as misses (`serve/instance._import`).
- service: the fitted profile's price of the tokens computed, from the row's context, item and
  history tokens and the simulated hits: a hit's tokens are recomputed at the method's ratio,
  a miss's all; a missed chunk is built behind the answer (one job per chunk), and a hit or
  a built chunk is the most recent in its store once the answer is out. The event loop, the
  core sharing and the busy slowdown are `served_cluster.ServedCluster`'s.

What it leaves out: the engine's chunk look-up order within a request; Ray's queueing.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..routing import ClusterView, CostModel, MethodConfig, SetLocality, routing_policy
from ..routing.balance import import_saving_ms
from ..errors import RcllmError
from ..routing.profiles import SpeedProfile, load_profile
from ..routing.registry import ITEM_POLICIES
from ..routing.requests import routing_request
from .served_cluster import ServedCluster
from .served_stores import ClusterCaches, Look
from .slowdown import slowdown_of


def router_profile(sweep: Mapping[str, Any], fallback: SpeedProfile) -> tuple[SpeedProfile, str]:
    """The profile the sweep's router priced with (its `--profile` file, a calibration run
    apart from the sweep) when it is still there, else `fallback`; and which it is."""
    path = (sweep.get("config") or {}).get("profile")
    if path and path not in ("calibrate", "builtin") and os.path.exists(str(path)):
        return load_profile(path), str(path)
    return fallback, "fit"


def series_ratios(sweep: Mapping[str, Any], cell: Mapping[str, Any]) -> tuple[float, float]:
    """The item and history recompute ratios of a cell's series (0.3/0.3 when unstated)."""
    for s in sweep.get("series") or ():
        if s.get("name") == cell.get("method") and s.get("policy") == cell.get("policy"):
            f = s.get("fields") or {}
            return float(f.get("item_ratio", 0.3)), float(f.get("history_ratio", 0.3))
    return 0.3, 0.3


@dataclass
class CellSetup:
    """What a cell's replay needs besides its rows: the policy object, the router's cost models
    (service estimate, and the price of fetching the missing items), the fitted price of a
    request's and of a build's work, the ratios and tag of the cell."""

    policy: Any
    cost: CostModel
    fetch_cost: CostModel
    price: Callable[[str, float, float], float]       # (method, computed, context) -> ms
    build: Callable[[int], float]                      # chunk tokens -> ms behind the answer
    ratios: tuple[float, float]
    tag: str
    imports: bool = True


class CachedCluster(ServedCluster):
    """`ServedCluster` whose arrivals are routed by the policy on the simulated stores, and
    whose requests are priced by what they find there when their service starts."""

    def __init__(self, jobs: list[tuple], rows: list[dict], caches: ClusterCaches,
                 setup: CellSetup, cores: float | None, builder_weight: float,
                 f_behind: float) -> None:
        super().__init__(jobs, len(caches.stores), cores, builder_weight, f_behind)
        self.rows, self.caches, self.setup = rows, caches, setup
        self.est = [0.0] * len(jobs)
        self.ready = [0.0] * len(jobs)
        self.looks: list[Look | None] = [None] * len(jobs)
        self.imported = [0] * len(jobs)
        self.moves: list[dict] = [{} for _ in jobs]       # each request's planned imports
        self.import_budget = [0.0] * len(jobs)
        self.payload: list[list] = [[] for _ in jobs]      # each behind job's chunks
        self.pending_chunks: list[deque] = [deque() for _ in range(self.k)]
        self.bchunks: list[list] = [[] for _ in range(self.k)]
        self.out_ms = np.zeros(self.k)
        self.depth = np.zeros(self.k, dtype=np.int64)

    def destination(self, own: bool, policy: str) -> int:
        j, s = self.nxt, self.setup
        row = self.rows[j]
        req = routing_request({"user_id": row.get("user"), "candidates": row.get("items") or [],
                               "history": row.get("history_items") or []},
                              self.caches.tokens)
        view = ClusterView(SetLocality(self.caches.views),
                           s.cost.profile)
        view.outstanding_ms[:] = self.out_ms
        view.queue_depth[:] = self.depth
        d = int(s.policy.choose(req, view))
        local = float(view.locality.local_tokens(req.items, req.item_tokens)[d])
        self.est[j] = float(s.cost.service_ms(s.cost.work(req.shape, local)))
        self.out_ms[d] += self.est[j]
        self.depth[d] += 1
        self.ready[j] = self.t
        saving = import_saving_ms(s.fetch_cost, req.shape, local, self.est[j])
        if s.imports and saving > 0:
            self.moves[j] = self.caches.import_for(row, d)
            self.import_budget[j] = saving
            for o, pairs in self.moves[j].items():
                wait = self.left[o] if self.serving[o] is not None else 0.0
                moved = sum(t for _k, t in pairs) * self.caches.kv
                self.ready[j] = max(self.ready[j], self.t + wait + 1e3 * moved
                                    / s.cost.profile.network_bytes_per_s)
        return d

    def _imports_in(self, j: int, d: int) -> float:
        """Request j starts on d: the ms it waits for its imports (at most what they save,
        `serve/instance._import`), storing them at d when they arrive within that."""
        if not self.moves[j]:
            return 0.0
        late = max(0.0, self.ready[j] - self.t)
        if late > self.import_budget[j]:
            return self.import_budget[j]           # not waited for: recomputed
        self.imported[j] = self.caches.store_import(d, self.moves[j])
        return late

    def start(self, d: int) -> None:
        if self.serving[d] is None and self.queues[d]:
            j = self.queues[d][0]
            row, s = self.rows[j], self.setup
            waited = self._imports_in(j, d)
            look = self.caches.look_up(row, d, s.tag)
            items = float(row.get("item_tokens") or 0)
            hist = float(row.get("history_tokens") or 0)
            # the row's prompt tokens; a hit's share of them reused, the rest computed
            ih = items * look.item_hit_tokens / max(look.item_tokens, 1e-9)
            hh = min(hist, look.history_hit_tokens)
            ctx = float(row.get("context_tokens") or 0)
            computed = ctx - (1 - s.ratios[0]) * ih - (1 - s.ratios[1]) * hh
            arr, _svc, _d, _b, f = self.jobs[j]
            svc = s.price(row.get("method") or "rcllm", computed, ctx) + waited
            # the misses are built behind the answer, one job per chunk kind (the engine builds
            # a kind's misses in one pass); they enter the store when their job ends
            jobs = [[b for b in look.built if (b[0][0] == "item") == is_item]
                    for is_item in (True, False)] if self.cores else []
            self.payload[j] = [chunks for chunks in jobs if chunks]
            behind = [s.build(sum(n for _k, n, _b in chunks)) for chunks in self.payload[j]]
            self.jobs[j] = (arr, svc, d, behind, f)
            look.imported = self.imported[j]
            self.looks[j] = look
        super().start(d)

    def start_behind(self, d: int) -> None:
        if not self.building[d] and self.behind[d]:
            self.bchunks[d] = self.pending_chunks[d].popleft()
        super().start_behind(d)

    def complete(self, run: dict[int, float], brun: dict[int, float]) -> None:
        for d in brun:
            if self.bleft[d] <= 1e-9:
                self.caches.put_chunks(d, self.bchunks[d])
        for d in run:
            if self.left[d] <= 1e-9:
                j = self.serving[d]
                if self.cores:
                    self.pending_chunks[d].extend(self.payload[j])
                else:           # no builder modelled: built as the answer leaves
                    self.caches.put_chunks(d, self.looks[j].built)
                self.caches.answered(d, self.rows[j])
                self.out_ms[d] -= self.est[j]
                self.depth[d] -= 1
        super().complete(run, brun)


def simulate_cached_cell(arrivals_s: list[float], rows: list[dict], caches: ClusterCaches,
                         setup: CellSetup, busy_slowdown: float | Mapping[str, float] = 1.0,
                         cores: float | None = None, builder_weight: float = 1.0
                         ) -> tuple[np.ndarray, np.ndarray, list[Look]]:
    """Predicted TTFT (ms) and service (ms) of a cell's answered requests and what each found,
    the stores carried on from the cell before."""
    pairs = [(a, r) for a, r in zip(arrivals_s, rows) if r["status"] == 200]
    jobs = [(a * 1e3, 0.0, 0, [], slowdown_of(busy_slowdown, r.get("method") or "rcllm"))
            for a, r in pairs]
    sim = CachedCluster(jobs, [r for _a, r in pairs], caches, setup, cores, builder_weight,
                        slowdown_of(busy_slowdown, "*"))
    while sim.pending():
        run, brun = sim.speeds()
        t_next = sim.advance(run, brun)
        sim.complete(run, brun)
        if t_next <= sim.t and sim.nxt < len(jobs):
            sim.arrive(sim.destination(True, setup.policy.name))
    ttft = np.array([sim.done[i] - jobs[i][0] for i in range(len(jobs))])
    return ttft, np.array([sim.jobs[i][1] for i in range(len(jobs))]), list(sim.looks)


def hit_figures(looks: list[Look]) -> dict[str, float | None]:
    """A cell's chunk hit ratio and item-token hit ratio from what its requests found."""
    lookups = sum(lk.lookups for lk in looks)
    items = sum(lk.item_tokens for lk in looks)
    return {"chunk_hit_ratio": sum(lk.hits for lk in looks) / lookups if lookups else None,
            "item_token_hit_ratio": (sum(lk.item_hit_tokens for lk in looks) / items
                                     if items else None),
            "kv_imported_items": sum(lk.imported for lk in looks)}


def measured_hits(cell: Mapping[str, Any]) -> dict[str, float | None]:
    """The same figures as the sweep measured them (its rows' chunk counts and item tokens
    computed on the spot)."""
    ok = [r for r in cell["requests"] if r["status"] == 200]
    items = sum(r.get("item_tokens", 0) for r in ok)
    return {"chunk_hit_ratio": cell.get("chunk_hit_ratio"),
            "item_token_hit_ratio": (1 - sum(r.get("item_miss_tokens", 0) for r in ok) / items
                                     if items else None),
            "kv_imported_items": cell.get("kv_imported_items")}


def check_simulable(sweep: Mapping[str, Any]) -> None:
    """RcllmError, before anything is simulated, when a cell's policy reads more than item KV
    and load (`registry.ITEM_POLICIES`): the replay's stores keep no picture of the prompt
    prefixes (prefix-aware) or the user sides, so it cannot route as that policy did."""
    bad = sorted({str(c.get("policy")) for c in sweep["cells"]
                  if c.get("policy") not in ITEM_POLICIES})
    if bad:
        raise RcllmError(f"--routing caches simulates the policies that read item KV and load "
                         f"({', '.join(ITEM_POLICIES)}); this sweep has cells routed by "
                         f"{', '.join(bad)}, whose picture the replay does not keep: predict it "
                         "with --routing replay or policy")


class CacheReplay:
    """The sweep's cells in order on one set of simulated stores (`--routing caches`): built
    from the placement and the warm-up once, then carried from cell to cell as served."""

    def __init__(self, sweep: Mapping[str, Any], profile: SpeedProfile,
                 price: Callable[[str, float, float], float], build: Callable[[int], float]):
        check_simulable(sweep)
        self.sweep = sweep
        self.router, self.router_source = router_profile(sweep, profile)
        self.caches = ClusterCaches(sweep, self.router.model.kv_bytes_per_token)
        self.caches.warm(sweep.get("warm_requests") or [],
                         int((sweep.get("trace") or {}).get("requests") or 0))
        self.price, self.build = price, build
        w_idle = sweep.get("affinity_idle_weight")
        self.cost = CostModel(self.router, MethodConfig())
        self.w_idle = None if w_idle is None else float(w_idle)
        self.fetch_cost = CostModel(self.router, MethodConfig(remote_items="fetch"))
        self.day = 0

    def cell(self, c: Mapping[str, Any], scale: float = 1.0,
             busy_slowdown: float | Mapping[str, float] = 1.0, cores: float | None = None,
             builder_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray, dict]:
        """The next cell: predicted TTFT and service (ms), and its hit figures."""
        self.day += 1                # the sweep redates its trace by a day per cell
        setup = CellSetup(routing_policy(c["policy"], self.cost, w_idle=self.w_idle),
                          self.cost, self.fetch_cost,
                          lambda m, n, ctx: scale * self.price(m, n, ctx),
                          lambda n: scale * self.build(n), series_ratios(self.sweep, c),
                          f"day{self.day}",
                          # `sim sweep --no-imports`: what the cells would do without them;
                          # a sweep served with `--no-imports` had none
                          imports=not ((self.sweep.get("what_if") or {}).get("no_imports")
                                       or (self.sweep.get("config") or {}).get("no_imports")))
        ttft, svc, looks = simulate_cached_cell(c["arrivals_s"], c["requests"], self.caches,
                                                setup, busy_slowdown, cores, builder_weight)
        return ttft, svc, hit_figures(looks)
