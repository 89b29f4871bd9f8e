"""The Ray deployment: K instance actors behind a global router (`RayBackend`).

The router is a small loop over boundary objects, one concern each:
- `actors.InstanceActors`: Ray, the actors, and the calls that go to all of them (the catalog,
  replicated to every live instance; measurements; fault injection);
- `cluster_start`: which items each instance builds at start (`place_items`) and what each
  kept (`warm`);
- `picture.Picture`: what each instance holds (item KV, user sides, a shared tier, prompt
  prefixes), learnt from the router's own calls, and the `rcllm.routing.ClusterView` a policy reads;
- `admission.Admission`: at most `queue_size` requests in flight per instance, beyond that 429;
- `health.Health`: dead and suspect instances, and the probe thread that re-admits them;
- `imports.ItemImports`: which item KV an instance imports from the others.

Placement: every instance keeps the whole catalog and builds its shard and the hot items at
start. An item off the chosen instance's shard is fetched from an instance that holds its KV
(through Ray's object store, while the request queues) when the cost model prices fetching
below recomputing, else recomputed; either way it is cached there after the answer. Beside a
shared Redis tier no item KV moves between instances (`tier.py`). Routing: a `rcllm.routing`
policy (affinity by default) over live views of the instances that still have room;
`/v1/prewarm` goes through the same policy, and the user's side counts as held where a prewarm
was sent from the moment it is sent (a relay's ranking that arrives while its prewarm still
queues follows it there; a prewarm that fails is forgotten), so a prewarm and the user's next
ranking land on one instance unless the policy's balance against load says otherwise. Failure: a request whose instance died or timed out is retried on another live
instance; a refused request ({"error"}) is answered, never retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..errors import RcllmError
from ..records import Item
from ..routing import CostModel, MethodConfig, SpeedProfile, routing_policy
from ..routing.prefixes import PrefixIndex
from ..routing.registry import REGISTRY, check_policy
from .actors import InstanceActors
from .admission import Admission
from .calibrate import router_profile
from .cluster_start import PLACEMENTS, place_items, warm
from .health import Health
from .imports import ItemImports, imports_item_kv
from .picture import Picture
from .spec import EngineSpec
from .tier import open_tier
from .views import LiveInstance, UserResidency, live_instances, routing_request
from .worker import Unavailable

log = logging.getLogger(__name__)


class RayBackend:
    def __init__(self, spec: EngineSpec, num_instances: int, queue_size: int,
                 policy: str = "affinity", address: str | None = None,
                 hot_fraction: float = 0.05, object_store_bytes: int = 256 << 20,
                 fetch_remote: bool = True, call_timeout_s: float = 60.0,
                 probe_interval_s: float = 2.0, profile: str | SpeedProfile = "calibrate",
                 save_profile_to: str | None = None, calibrate_cases: int = 3,
                 placement: str = "metis", placement_seed: int = 0,
                 w_idle: float | None = None) -> None:
        if num_instances < 1:
            raise RcllmError("--instances must be >= 1")
        if placement not in PLACEMENTS:
            raise RcllmError(f"placement must be one of {', '.join(PLACEMENTS)}, not "
                             f"{placement!r}")
        self.queue_size = queue_size
        self.admission = Admission(queue_size)
        self._actors = InstanceActors(spec, num_instances, queue_size, address,
                                      object_store_bytes)
        instances, residency, tier = self._place(spec, hot_fraction, placement, placement_seed)
        self._price(profile, save_profile_to, calibrate_cases)
        self.picture = Picture(instances, self.profile, residency, tier, self._prefixes())
        self.imports = ItemImports(CostModel(self.profile, MethodConfig(remote_items="fetch")),
                                   imports_item_kv(spec, fetch_remote),
                                   spec.engine_config()[0].reuse.method)
        self.w_idle = w_idle        # affinity's idleness weight; None: from the cost model
        self.use_policy(policy)
        self.retries = 0            # requests sent again after their instance failed
        self.health = Health(instances, lambda k, t: self.actors[k].probe.remote(t),
                             self.picture.forget, call_timeout_s, probe_interval_s).start()

    def _place(self, spec: EngineSpec, hot_fraction: float, how: str, seed: int
               ) -> tuple[list[LiveInstance], UserResidency | None, Any]:
        """Places and builds the items at start; (the router's instances, its user-side map,
        its picture of a shared tier or None)."""
        ping = self._actors.pings[0]
        self.history_window = int(ping["history_window"])    # the reviews a prompt keeps
        # the instruction's tokens every prefix cache holds from start-up (the sweep's hit
        # ratio counts only hits beyond them)
        self.prefix_instruction_tokens = int(ping["prefix_cache"]["instruction_tokens"])
        ttl = ping.get("user_prefix_ttl_s")
        residency = (UserResidency(ttl, history_window=ping.get("history_window") or 0)
                     if ttl else None)              # None: no user-prefix cache
        self.item_tokens: dict[str, int] = self._actors.get(0, "item_tokens")
        tier = (open_tier(spec.redis_url, self._actors.get(0, "item_redis_keys"))
                if spec.redis_url else None)        # the router's picture of a shared tier
        placed, self.placement_info = place_items(spec.dataset(), self.item_tokens,
                                                  len(self.actors), hot_fraction, how, seed)
        held, self.placement_info["held_after_build"] = warm(self._actors, placed, tier)
        return live_instances(held, tier.held if tier else None), residency, tier

    def _prefixes(self) -> PrefixIndex | None:
        """The router's picture of the instances' prefix caches (None when the engines insert
        no prompts: prefix-aware routing then refuses to route)."""
        info = self._actors.pings[0]["prefix_cache"]
        return (PrefixIndex(len(self.actors), info["capacity_tokens"]) if info["inserts"]
                else None)

    def _price(self, profile: str | SpeedProfile, save_to: str | None, cases: int) -> None:
        """The router's speed profile (calibrated on instance 0, built in, or given) and its
        cost model."""
        self.profile = router_profile(profile, lambda: self._actors.get(0, "calibrate", cases))
        # the item KV of the whole catalog, for budgets stated as a share of it
        self.placement_info["catalog_item_kv_bytes"] = (
            sum(self.item_tokens.values()) * self.profile.model.kv_bytes_per_token)
        if save_to:
            from .calibrate import save_profile

            save_profile(self.profile, save_to)
        log.info("routing with speed profile %s", self.profile.name)
        self.cost = CostModel(self.profile, MethodConfig())

    def use_policy(self, name: str) -> None:
        """Routes with policy `name` from now on (a fresh object: no carried state); affinity
        with this backend's idleness weight (`w_idle`, None: derived per decision).
        RcllmError for a policy that reads user sides on a deployment without them."""
        if REGISTRY[check_policy(name)].reads == "users" and self.residency is None:
            raise RcllmError(f"policy {name!r} routes by user sides: it needs the pointwise "
                             "scorer (the user-prefix cache)")
        self.policy = routing_policy(name, self.cost, w_idle=self.w_idle)

    # ---- the picture's parts, by their old names (the sweep and the tests read them) -------
    @property
    def actors(self) -> list:
        return self._actors.handles

    @property
    def instances(self) -> list[LiveInstance]:
        return self.picture.instances

    @property
    def residency(self) -> UserResidency | None:
        return self.picture.residency

    @residency.setter
    def residency(self, value: UserResidency | None) -> None:
        self.picture.residency = value

    @property
    def tier(self):
        return self.picture.tier

    # ---- requests -------------------------------------------------------------------------
    async def rank(self, payload: dict[str, Any]) -> dict[str, Any]:
        request = routing_request(payload, self.item_tokens, self.residency is not None,
                                  self.history_window)
        return await self._route("rank", payload, request)

    async def prewarm(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Routed by the same policy as /v1/rank over the user side alone: to the instance
        that holds the user's user side, else by load. Refused (RcllmError) without a
        user-prefix cache."""
        if self.residency is None:
            raise RcllmError("prewarm needs the pointwise scorer (the user-prefix cache)")
        request = routing_request({**payload, "candidates": []}, self.item_tokens, True,
                                  self.history_window)
        return await self._route("prewarm", payload, request)

    async def _route(self, kind: str, payload: dict[str, Any], request) -> dict[str, Any]:
        """Chooses an instance, calls `kind` (rank | prewarm) there; retries elsewhere when it
        died or timed out. Admission happens once: a retry of an admitted request is never
        refused."""
        tried: set[int] = set()
        while True:
            live = [i for i in self.instances if i.usable and i.index not in tried]
            if not live:
                raise Unavailable("no live instance can serve the request")
            if not tried:
                live = self.admission.admit(live, self.instances)
            inst, local, estimate_ms = self._choose(live, payload, request)
            if kind == "prewarm":       # the user's next ranking follows it from now on
                self.picture.prewarm_sent(inst, payload)
            out = await self._call(kind, inst, payload, request, local, estimate_ms)
            if out is None or "error" in out:
                if kind == "prewarm":
                    self.picture.prewarm_failed(inst, payload)
            if out is None:
                tried.add(inst.index)
                self.retries += 1
                continue
            if "error" in out:
                raise RcllmError(out["error"])
            self.picture.user_served(kind, inst, payload, out)
            if kind == "rank":
                self.picture.prompt_served(inst, request, out)
            return out

    def _choose(self, live: list[LiveInstance], payload: dict[str, Any], request
                ) -> tuple[LiveInstance, float, float]:
        """The policy's instance, the request's item tokens local there, and its service
        estimate there (ms)."""
        view = self.picture.view(live, payload)
        pos = self.policy.choose(request, view)
        local = view.locality.local_tokens(request.items, request.item_tokens)[pos]
        return live[pos], local, float(self.cost.service_ms(self.cost.work(request.shape,
                                                                           local)))

    async def _call(self, kind: str, inst: LiveInstance, payload: dict[str, Any], request,
                    local: float, estimate_ms: float) -> dict[str, Any] | None:
        """`kind` on `inst`: its answer (the picture updated), or None when the instance died
        or timed out (marked so; the caller retries elsewhere)."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        inst.started(estimate_ms)
        t0 = time.perf_counter()
        out = None
        try:
            out = await self.health.answer(inst, self._send(kind, inst, payload, request,
                                                            local, estimate_ms))
        except (RayActorError, ActorUnavailableError) as exc:
            self.health.lost(inst, exc)
        except asyncio.TimeoutError:
            self.health.suspect(inst, f"no answer within {self.health.call_timeout_s:g} s")
        finally:    # also on cancellation (the app's request timeout): no leaked slot
            if out is None:
                inst.abandoned(estimate_ms)
        if out is not None:
            lost = out.pop("lost_items", None)      # the router's, not the client's
            self.picture.answered(inst, estimate_ms, (time.perf_counter() - t0) * 1e3,
                                  list(payload.get("candidates", ())), lost)
        return out

    def _send(self, kind: str, inst: LiveInstance, payload: dict[str, Any], request,
              local: float, estimate_ms: float):
        """The Ray call of `kind` on `inst`; a ranking with the exports of the item KV it
        imports (`imports.ItemImports`: the request's service estimate is what recomputing
        them costs)."""
        actor = self.actors[inst.index]
        if kind != "rank":
            return actor.prewarm.remote(payload)
        plan, wait_ms = self.imports.plan(inst, request, local, estimate_ms,
                                          payload.get("method"), self.instances)
        refs = [self.actors[k].export_items.remote(items) for k, items in plan.items()]
        return actor.rank.remote(payload, refs, wait_ms)

    # ---- catalog (replicated to every live instance) ------------------------------------------
    def _on_all(self, method: str, *args) -> list[Any]:
        return self._actors.on_all(self.instances, self.health, method, *args)

    # ---- a sweep's cells from one state of the stores (`bench serve --sweep --cell-reset`) --
    def keep_snapshots(self) -> int:
        """Each live instance saves what its stores hold now (`EngineHost.keep_snapshot`);
        returns the entries saved over all."""
        return sum(self._actors.get(i.index, "keep_snapshot") for i in self.instances
                   if i.alive)

    def restore_snapshots(self) -> None:
        """Each live instance puts its snapshot back, and the router's picture of it becomes
        what it holds then."""
        for inst in self.instances:
            if inst.alive:
                inst.cached = set(self._actors.get(inst.index, "restore_snapshot"))

    def user_prefix_stats(self) -> dict[str, float] | None:
        """The user-prefix caches' counters summed over the usable instances (for /metrics)."""
        if self.residency is None:
            return None
        rows = [r for r in self._on_all("user_prefix_stats") if r]
        return {k: sum(r.get(k, 0) for r in rows) for k in rows[0]} if rows else None

    def tier_stats(self) -> dict[str, object] | None:
        return self.picture.tier_stats()

    def store_stats(self) -> dict[str, dict[str, int]]:
        """Per-tier chunk-store counters summed over the usable instances; the shared Redis
        tier's bytes and entries are what one instance sees (the max), not a sum."""
        out: dict[str, dict[str, int]] = {}
        for rows in self._on_all("store_stats"):
            for tier, row in rows.items():
                acc = out.setdefault(tier, {})
                for k, v in row.items():
                    shared = tier.startswith("redis") and k in ("bytes", "entries")
                    acc[k] = max(acc.get(k, 0), v) if shared else acc.get(k, 0) + v
        return out

    def submit_items(self, items: list[Item]) -> int:
        rows = [{"item_id": str(i.item_id), "title": i.title, "description": i.description,
                 "category": i.category} for i in items]
        pending = max(self._on_all("submit_items", rows))
        ids = [r["item_id"] for r in rows]
        # their (new) chunk keys, written behind to the tier
        self.picture.items_submitted(ids, self._actors.get(0, "item_redis_keys", ids)
                                     if self.tier is not None else None)
        return pending

    def delete_item(self, item_id: str) -> bool:
        self.picture.item_deleted(item_id)
        return any(self._on_all("delete_item", item_id))

    def get_item(self, item_id: str) -> tuple[Item | None, bool]:
        answers = self._on_all("item", item_id)
        row = answers[0][0]
        return (None if row is None else Item(**row)), any(p for _row, p in answers)

    def pending(self) -> int:
        return max(self._on_all("pending"))

    def queue_depth(self) -> int:
        return sum(i.inflight for i in self.instances if i.alive)

    def ready(self) -> bool:
        return any(i.usable for i in self.instances)

    # ---- measurements and fault injection ---------------------------------------------------
    def niceness(self) -> list[int]:
        """Each instance's scheduling priority (nice value; this process's unless Ray was
        started elsewhere with its default of 15 for workers)."""
        return [p["niceness"] for p in self._actors.get_all("ping")]

    def pids(self) -> list[int]:
        """The process id of each instance actor (for RSS sampling by `bench serve`)."""
        return [p["pid"] for p in self._actors.get_all("ping")]

    def speed_reference(self) -> list[float]:
        """Each instance's reference pass (ms), timed one instance at a time so that none
        shares the cores with another: the speed of the machine, not of two engines on it
        (the simulator models that sharing itself)."""
        return [float(self._actors.get(k, "speed_reference", timeout=120))
                for k in range(len(self.actors))]

    def kill_instance(self, index: int) -> None:
        """Kills one actor (fault-injection for tests); the router finds out on its next call."""
        self._actors.kill(index)

    def stall_instance(self, index: int, seconds: float) -> None:
        """Fault injection for tests: instance `index` computes nothing for `seconds`."""
        self._actors.get(index, "stall", seconds)

    def unstall_instance(self, index: int) -> None:
        """Ends `stall_instance(index, ...)` early."""
        self._actors.get(index, "unstall")

    def close(self) -> None:
        self.health.close()
        if self.tier is not None:
            self.tier.close()
        self._actors.close()
