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
- the prefix and user-side pictures (`served_pictures.Pictures`): the router's prefix index,
  which prefix-aware reads and the full and prefix methods' answers fill, and the cell's user
  sides, which user-side (and any policy of a pointwise deployment) reads, a relay's prewarms
  and the rankings of the methods that read the user side fill.
- service: the fitted profile's price of the tokens computed, from the row's context, item and
  history tokens and the simulated hits: a hit's tokens are recomputed at the method's ratio,
  a miss's all; full computes every token and looks nothing up; prefix looks up no chunk and
  computes all but the prefix cache's exact tokens (the instruction and the held chain);
  exact-user all but its user side where it is held (else all but the prefix cache's), its
  items never looked up and its history chunks only on a miss (priced as computed: late@0).
  A missed chunk is built behind the answer (one job per chunk), and a hit or a built chunk
  is the most recent in its store once the answer is out. The event loop, the
  core sharing and the busy slowdown are `served_cluster.ServedCluster`'s.

What it leaves out: the engine's chunk look-up order within a request; Ray's queueing; the
user-side hits of the reuse methods (rcllm and the like: priced by their chunks as before);
the prewarms' engine time.
"""

from __future__ import annotations

import copy
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..config import REUSE_METHODS
from ..routing import ClusterView, CostModel, MethodConfig, routing_policy
from ..routing.balance import import_saving_ms
from ..routing.profiles import SpeedProfile, load_profile
from .served_cluster import ServedCluster
from .served_pictures import Exact, Pictures, check_policies, exact_figures, prewarm_times
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
    pictures: Pictures
    imports: bool = True
    prewarms: list = field(default_factory=list)    # a relay's: (send ms, its ranking's row)


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
        self.pics = setup.pictures
        self.prewarms = deque(setup.prewarms)           # (send ms, row) of a relay's prewarms
        self.reqs: list = [None] * len(jobs)            # each request as the router saw it
        self.exacts: list[Exact] = [Exact() for _ in jobs]

    def _route(self, row: Mapping[str, Any], req) -> tuple[int, ClusterView]:
        """The policy's choice for `req` (of `row`) on the router's picture now."""
        view = self.pics.view(row, self.caches.views, self.setup.cost.profile, self.t)
        view.outstanding_ms[:] = self.out_ms
        view.queue_depth[:] = self.depth
        return int(self.setup.policy.choose(req, view)), view

    def _prewarm(self) -> None:
        """A relay's prewarms sent by now, each routed over the user side alone and noted
        where it went (`serve/router.prewarm`; its engine time is not simulated)."""
        while self.prewarms and self.prewarms[0][0] <= self.t:
            _at, row = self.prewarms.popleft()
            d, _view = self._route(row, self.pics.request(row, candidates=False))
            self.pics.note(row, d, self.t)

    def destination(self, own: bool, policy: str) -> int:
        j, s = self.nxt, self.setup
        row = self.rows[j]
        self._prewarm()
        self.reqs[j] = req = self.pics.request(row)
        d, view = self._route(row, req)
        local = float(view.locality.local_tokens(req.items, req.item_tokens)[d])
        self.est[j] = float(s.cost.service_ms(s.cost.work(req.shape, local)))
        self.out_ms[d] += self.est[j]
        self.depth[d] += 1
        self.ready[j] = self.t
        saving = import_saving_ms(s.fetch_cost, req.shape, local, self.est[j])
        # the router plans imports for the methods that reuse item KV (`serve/imports`)
        if s.imports and saving > 0 and (row.get("method") or "rcllm") in REUSE_METHODS:
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
            self.exacts[j] = exact = self.pics.exact(row, self.reqs[j], d, self.t)
            look = self.caches.look_up(looked_up(row, exact), d, s.tag)
            computed = self._computed(row, look, exact)
            ctx = float(row.get("context_tokens") or 0)
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

    def _computed(self, row: Mapping[str, Any], look: Look, exact: Exact) -> float:
        """The tokens the row's request computes given what it found."""
        ctx, s = float(row.get("context_tokens") or 0), self.setup
        method = row.get("method") or "rcllm"
        if method == "full":
            return ctx
        if method not in REUSE_METHODS:       # prefix, exact-user: all but the exact part
            return max(1.0, ctx - exact.reused)
        items = float(row.get("item_tokens") or 0)
        hist = float(row.get("history_tokens") or 0)
        # the row's prompt tokens; a hit's share of them reused, the rest computed
        ih = items * look.item_hit_tokens / max(look.item_tokens, 1e-9)
        hh = min(hist, look.history_hit_tokens)
        return ctx - (1 - s.ratios[0]) * ih - (1 - s.ratios[1]) * hh

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
                self.pics.answered(self.rows[j], self.reqs[j], d, self.t)
                self.out_ms[d] -= self.est[j]
                self.depth[d] -= 1
        super().complete(run, brun)


def simulate_cached_cell(arrivals_s: list[float], rows: list[dict], caches: ClusterCaches,
                         setup: CellSetup, busy_slowdown: float | Mapping[str, float] = 1.0,
                         cores: float | None = None, builder_weight: float = 1.0
                         ) -> tuple[np.ndarray, np.ndarray, list[Look], list[Exact]]:
    """Predicted TTFT (ms) and service (ms) of a cell's answered requests and what each found
    in the chunk stores and before them (prefix cache, user side), the stores and the prefix
    picture carried on from the cell before."""
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
    return (ttft, np.array([sim.jobs[i][1] for i in range(len(jobs))]), list(sim.looks),
            list(sim.exacts))


def looked_up(row: Mapping[str, Any], exact: Exact) -> Mapping[str, Any]:
    """The part of `row` whose chunks the engine looks up (`engine/lookups.chunk_matches`):
    all with a method that reuses chunk KV; none with full or prefix; exact-user (late@0)
    no item, and its history only where its user side missed."""
    method = row.get("method") or "rcllm"
    if method in REUSE_METHODS:
        return row
    hist = row.get("history_items") if exact.user_side == "miss" else []
    return {**row, "items": [], "history_items": hist or []}


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
            "kv_imported_items": cell.get("kv_imported_items"),
            **{k: cell.get(k) for k in ("prefix_hit_ratio", "prefix_hit_requests",
                                        "user_prefix_hit_ratio", "user_prefix_append_ratio")}}


def check_simulable(sweep: Mapping[str, Any]) -> None:
    """RcllmError, before anything is simulated, when a cell's policy reads a picture the
    replay does not keep (`served_pictures.SIMULABLE_READS`; an unknown policy too)."""
    check_policies([str(c.get("policy")) for c in sweep["cells"]])


class CacheReplay:
    """The sweep's cells in order on one set of simulated stores (`--routing caches`): built
    from the placement and the warm-up once, then carried from cell to cell as served (or,
    for a sweep run with `--cell-reset`, put back as the warm-up left them before each)."""

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
        # the router's prefix index and user sides (one index for the whole sweep, as served)
        self.pictures = Pictures(sweep, self.router.model.kv_bytes_per_token,
                                 len(self.caches.stores), self.caches.tokens)
        self.pictures.check([str(c.get("policy")) for c in sweep["cells"]])
        self.day = 0
        # `bench serve --sweep --cell-reset`: each cell from the stores the warm-up left
        self.after_warm = copy.deepcopy(self.caches) if sweep.get("cell_reset") else None

    def cell(self, c: Mapping[str, Any], scale: float = 1.0,
             busy_slowdown: float | Mapping[str, float] = 1.0, cores: float | None = None,
             builder_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray, dict]:
        """The next cell: predicted TTFT and service (ms), and its hit figures."""
        self.day += 1                # the sweep redates its trace by a day per cell
        if self.after_warm is not None:
            self.caches = copy.deepcopy(self.after_warm)
        self.pictures.new_cell(f"day{self.day}", series_ratios(self.sweep, c)
                               if self.sweep.get("router_prices_ratios") else None)
        setup = CellSetup(routing_policy(c["policy"], self.cost, w_idle=self.w_idle),
                          self.cost, self.fetch_cost,
                          lambda m, n, ctx: scale * self.price(m, n, ctx),
                          lambda n: scale * self.build(n), series_ratios(self.sweep, c),
                          f"day{self.day}", self.pictures,
                          # `sim sweep --no-imports`: what the cells would do without them;
                          # a sweep served with `--no-imports` had none
                          imports=not ((self.sweep.get("what_if") or {}).get("no_imports")
                                       or (self.sweep.get("config") or {}).get("no_imports")),
                          prewarms=prewarm_times(c))
        ttft, svc, looks, exacts = simulate_cached_cell(c["arrivals_s"], c["requests"],
                                                        self.caches, setup, busy_slowdown,
                                                        cores, builder_weight)
        ok = [r for r in c["requests"] if r["status"] == 200]
        return ttft, svc, {**hit_figures(looks),
                           **exact_figures(exacts, ok, self.pictures.instruction)}
