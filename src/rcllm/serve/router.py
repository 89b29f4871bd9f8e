"""The Ray deployment: K instance actors behind a global router (`RayBackend`).

Placement (`cluster_start.place_items`): each instance builds its shard and the hot items at
start, and the router starts from what each kept. Every instance keeps the whole catalog. An
item off the chosen instance's shard is fetched from an instance that holds its KV (through
Ray's object store, while the request queues) when the cost model prices fetching below
recomputing, else recomputed; the chosen instance waits for a late export only as long as it
saves (`imports.py`); either way the item is cached there after the answer. Beside a shared
Redis tier no item KV moves between instances: an item the tier holds is local everywhere, and
the router learns what a capped tier evicts from Redis itself (`tier.py`).
Routing: a `rcllm.routing` policy (affinity by default) over live views of the instances that
still have room; in a pointwise deployment the user's resident user side counts as locality too
(`views.UserResidency`), and `/v1/prewarm` goes through the same policy, so a prewarm and the
user's next ranking land on one instance. Admission: at most `queue_size` requests in flight
per instance, beyond that 429. Failure: a call that fails because its actor died marks the
instance dead and the request is retried on another live instance; a call that gets no answer
within `call_timeout_s` marks the instance suspect (no requests) and is retried elsewhere; a
probe thread asks every suspect instance whether its engine is free again and re-admits it.
A refused request ({"error"}) is answered, never retried.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from ..config import REUSE_METHODS
from ..errors import RcllmError
from ..records import Item
from ..routing import CostModel, MethodConfig, SpeedProfile, routing_policy
from .calibrate import router_profile
from .cluster_start import PLACEMENTS, init_ray, place_items
from .imports import import_plan, imports_item_kv
from .instance import Instance
from .spec import EngineSpec
from .tier import open_tier
from .views import LiveInstance, UserResidency, cluster_view, live_instances, routing_request
from .worker import Overloaded, Unavailable

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
        import ray

        if num_instances < 1:
            raise RcllmError("--instances must be >= 1")
        if placement not in PLACEMENTS:
            raise RcllmError(f"placement must be one of {', '.join(PLACEMENTS)}, not "
                             f"{placement!r}")
        self._ray = ray
        self._owns_ray = init_ray(address, object_store_bytes)
        self.queue_size = queue_size
        actor = ray.remote(num_cpus=0, max_concurrency=queue_size + 2, max_restarts=0)(Instance)
        self.actors = [actor.remote(k, spec) for k in range(num_instances)]
        pings = ray.get([a.ping.remote() for a in self.actors])
        ttl = pings[0].get("user_prefix_ttl_s")
        self.residency = (UserResidency(ttl, history_window=pings[0].get("history_window") or 0)
                          if ttl else None)               # None: no user-prefix cache
        self.item_tokens: dict[str, int] = ray.get(self.actors[0].item_tokens.remote())
        self.tier = (open_tier(spec.redis_url, ray.get(self.actors[0].item_redis_keys.remote()))
                     if spec.redis_url else None)   # the router's picture of a shared tier
        placed, self.placement_info = place_items(spec.dataset(), self.item_tokens,
                                                  num_instances, hot_fraction, placement,
                                                  placement_seed)
        held = self._warm(placed)
        self.instances = live_instances(held, self.tier.held if self.tier else None)
        self.profile = router_profile(profile, lambda: ray.get(
            self.actors[0].calibrate.remote(calibrate_cases)))
        # the item KV of the whole catalog, for budgets stated as a share of it
        self.placement_info["catalog_item_kv_bytes"] = (
            sum(self.item_tokens.values()) * self.profile.model.kv_bytes_per_token)
        if save_profile_to:
            from .calibrate import save_profile

            save_profile(self.profile, save_profile_to)
        log.info("routing with speed profile %s", self.profile.name)
        self.cost = CostModel(self.profile, MethodConfig())
        self.fetch_cost = CostModel(self.profile, MethodConfig(remote_items="fetch"))
        self.fetch_remote = imports_item_kv(spec, fetch_remote)
        # the least an importer waits for an export, whatever the cost model says it saves
        # (0; a test on a tiny model, whose recompute costs less than a Ray round trip, sets it)
        self.import_wait_floor_ms = 0.0
        # the method of a request that names none (only the reuse methods import item KV)
        self.default_method = spec.engine_config()[0].reuse.method
        self.w_idle = w_idle        # affinity's idleness weight; None: from the cost model
        self.use_policy(policy)
        self.retries = 0
        self.call_timeout_s = call_timeout_s
        self.probe_interval_s = probe_interval_s
        self.readmitted = 0
        self._stop = threading.Event()
        self._prober = threading.Thread(target=self._probe_loop, name="rcllm-probe",
                                        daemon=True)
        self._prober.start()

    def use_policy(self, name: str) -> None:
        """Routes with policy `name` from now on (a fresh object: no carried state); affinity
        with this backend's idleness weight (`w_idle`, None: derived per decision)."""
        self.policy = routing_policy(name, self.cost, w_idle=self.w_idle)

    def _warm(self, held: list[list[str]]) -> list[list[str]]:
        """Builds each instance's placed items; returns what the router counts as held: what
        each store kept of its placement (a shard larger than the store keeps only its
        last-built part). Beside a shared tier, what the tier kept joins its picture."""
        self._ray.get([a.build_items.remote(items) for a, items in zip(self.actors, held)])
        kept = self._ray.get([a.cached_items.remote() for a in self.actors])
        held = [sorted(set(h).intersection(k)) for h, k in zip(held, kept)]
        if self.tier is not None:
            self.tier.added(self.tier.present())
        self.placement_info["held_after_build"] = [len(h) for h in held]
        return held

    # ---- requests -------------------------------------------------------------------------
    async def rank(self, payload: dict[str, Any]) -> dict[str, Any]:
        request = routing_request(payload, self.item_tokens, self.residency is not None)
        return await self._route("rank", payload, request)

    async def prewarm(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Routed by the same policy as /v1/rank over the user side alone: to the instance
        that holds the user's user side, else by load. Refused (RcllmError) without a
        user-prefix cache."""
        if self.residency is None:
            raise RcllmError("prewarm needs the pointwise scorer (the user-prefix cache)")
        request = routing_request({**payload, "candidates": []}, self.item_tokens, True)
        return await self._route("prewarm", payload, request)

    async def _route(self, method: str, payload: dict[str, Any], request) -> dict[str, Any]:
        """Chooses an instance, calls `method` there; retries elsewhere when it died or timed
        out. Admission happens once: a retry of an admitted request is never refused."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        user = payload["user_id"]
        tried: set[int] = set()
        first = True
        while True:
            live = [i for i in self.instances if i.usable and i.index not in tried]
            if not live:
                raise Unavailable("no live instance can serve the request")
            if first:       # admission; a retry of an admitted request is never refused
                live = [i for i in live if i.inflight < self.queue_size]
                if not live:
                    raise Overloaded(self._retry_after_s())
                first = False
            home = (self.residency.home(user, payload.get("history"))
                    if self.residency is not None else None)
            if self.tier is not None:
                self.tier.drain()           # what a capped tier evicted leaves its picture
            view = cluster_view(live, self.profile, user if home is not None else None, home)
            pos = self.policy.choose(request, view)
            inst = live[pos]
            local = view.locality.local_tokens(request.items, request.item_tokens)[pos]
            estimate_ms = float(self.cost.service_ms(self.cost.work(request.shape, local)))
            inst.started(estimate_ms)
            t0 = time.perf_counter()
            done = False
            try:
                actor = self.actors[inst.index]
                if method == "rank":
                    ref = actor.rank.remote(payload, *self._imports(
                        inst, request, local, estimate_ms,
                        payload.get("method") or self.default_method))
                else:
                    ref = actor.prewarm.remote(payload)
                out = await self._wait(inst, ref)
                done = True
            except (RayActorError, ActorUnavailableError) as exc:
                self._lost(inst, exc)
            except asyncio.TimeoutError:
                self._suspect(inst, f"no answer within {self.call_timeout_s:g} s")
            finally:    # also on cancellation (the app's request timeout): no leaked slot
                if not done:
                    inst.abandoned(estimate_ms)
            if not done:
                tried.add(inst.index)
                self.retries += 1
                continue
            lost = out.pop("lost_items", None)      # the router's, not the client's
            self._answered(inst, estimate_ms, (time.perf_counter() - t0) * 1e3,
                           list(payload.get("candidates", ())), lost)
            if "error" in out:
                raise RcllmError(out["error"])
            if self.residency is not None and (
                    method == "prewarm" or out["stats"].get("user_prefix", "off") != "off"):
                self.residency.note(user, inst.index, payload.get("history"))
            return out

    def _answered(self, inst: LiveInstance, estimate_ms: float, ms: float, served: list[str],
                  lost: list[str] | None) -> None:
        """An answer: `inst`'s picture drops what its memory lost and takes the candidates,
        whose misses are written behind to the shared tier too, when there is one."""
        inst.finished(estimate_ms, ms, served, lost)
        if self.tier is not None:
            self.tier.added(served)

    async def _wait(self, inst: LiveInstance, ref) -> dict[str, Any]:
        """The call's answer. TimeoutError once `inst` has answered nothing (this call nor any
        other) for `call_timeout_s`: a call queued behind others on a busy instance that keeps
        answering is waited for (before, such a call timed out under sustained load above
        capacity, and both instances of a soak were marked suspect: every request 503)."""
        fut = asyncio.wrap_future(ref.future())
        started = time.monotonic()
        while True:
            deadline = max(started, inst.last_answer_s) + self.call_timeout_s
            try:
                return await asyncio.wait_for(asyncio.shield(fut),
                                              max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                if time.monotonic() >= max(started, inst.last_answer_s) + self.call_timeout_s:
                    fut.cancel()
                    raise

    def _imports(self, inst: LiveInstance, request, local_tokens: float, estimate_ms: float,
                 method: str) -> tuple[list, float]:
        """Object refs of the owners' exports of the request's items `inst` lacks, and the
        most `inst` waits for them once its engine is free (`imports.import_plan`; the
        request's service estimate there is what recomputing them costs); none for a method
        that reads no item KV (full, prefix)."""
        if not self.fetch_remote or method not in REUSE_METHODS:
            return [], 0.0
        plan, wait_ms = import_plan(self.fetch_cost, inst, request, local_tokens, estimate_ms,
                                    self.instances)
        refs = [self.actors[k].export_items.remote(items) for k, items in plan.items()]
        return refs, max(wait_ms, self.import_wait_floor_ms) if refs else 0.0

    def _lost(self, inst: LiveInstance, exc: BaseException) -> None:
        if inst.alive:
            log.warning("instance %d is dead (%s); its requests go elsewhere", inst.index,
                        type(exc).__name__)
        inst.alive = False
        inst.failures.append(type(exc).__name__)
        if self.residency is not None:
            self.residency.forget_instance(inst.index)

    def _suspect(self, inst: LiveInstance, why: str) -> None:
        """No requests for `inst` until a probe finds its engine free (it may be stuck or
        just slow: it is not declared dead, and what it is computing still completes)."""
        if not inst.suspect:
            log.warning("instance %d is suspect (%s); requests go elsewhere until a probe "
                        "answers", inst.index, why)
        inst.suspect = True
        inst.failures.append("timeout")

    def _probe_loop(self) -> None:
        """Every `probe_interval_s`: each suspect instance gets one probe (its engine lock
        within the interval); a True answer re-admits it, a dead actor is marked dead."""
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        wait = self.probe_interval_s
        while not self._stop.wait(wait):
            for inst in [i for i in self.instances if i.alive and i.suspect]:
                try:
                    ok = self._ray.get(self.actors[inst.index].probe.remote(wait),
                                       timeout=wait + 10)
                except (RayActorError, ActorUnavailableError) as exc:
                    self._lost(inst, exc)
                    continue
                except GetTimeoutError:
                    continue
                except Exception:  # noqa: BLE001 - Ray shutting down under us
                    return
                if ok:
                    inst.suspect = False
                    self.readmitted += 1
                    log.warning("instance %d answers its probe again: re-admitted", inst.index)

    def _retry_after_s(self) -> int:
        live = [i for i in self.instances if i.usable] or self.instances
        wait_ms = min(i.inflight * i.service_ms for i in live)
        return max(1, int(wait_ms / 1e3 + 0.999))

    # ---- catalog (replicated to every live instance) ------------------------------------------
    def _on_all(self, method: str, *args) -> list[Any]:
        """Calls `method` on every live instance and returns the answers of the usable ones.
        A suspect instance gets the call too (it runs once its engine is free, so it does not
        miss a catalog change) but is not waited for; one that does not answer within 30 s
        becomes suspect, one whose actor died is marked dead."""
        from ray.exceptions import GetTimeoutError

        refs = [(i, getattr(self.actors[i.index], method).remote(*args))
                for i in self.instances if i.alive]
        out = []
        for inst, ref in refs:
            if inst.suspect:
                continue
            try:
                out.append(self._ray.get(ref, timeout=30))
            except GetTimeoutError:
                self._suspect(inst, f"{method} got no answer within 30 s")
            except Exception as exc:  # noqa: BLE001 - a dead instance
                self._lost(inst, exc)
        if not out:
            raise Unavailable("no live instance")
        return out

    def user_prefix_stats(self) -> dict[str, float] | None:
        """The user-prefix caches' counters summed over the usable instances (for /metrics)."""
        if self.residency is None:
            return None
        rows = [r for r in self._on_all("user_prefix_stats") if r]
        return {k: sum(r.get(k, 0) for r in rows) for k in rows[0]} if rows else None

    def tier_stats(self) -> dict[str, object] | None:
        return self.tier.stats([i.cached for i in self.instances]) if self.tier else None

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
        for inst in self.instances:
            inst.cached.update(ids)
        if self.tier is not None:       # their (new) chunk keys, written behind to the tier
            self.tier.joined(self._ray.get(self.actors[0].item_redis_keys.remote(ids)))
        return pending

    def delete_item(self, item_id: str) -> bool:
        for inst in self.instances:
            inst.cached.discard(item_id)
        if self.tier is not None:
            self.tier.discard(item_id)
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

    def niceness(self) -> list[int]:
        """Each instance's scheduling priority (nice value; this process's unless Ray was
        started elsewhere with its default of 15 for workers)."""
        return [p["niceness"] for p in self._ray.get([a.ping.remote() for a in self.actors])]

    def pids(self) -> list[int]:
        """The process id of each instance actor (for RSS sampling by `bench serve`)."""
        return [p["pid"] for p in self._ray.get([a.ping.remote() for a in self.actors])]

    def speed_reference(self) -> list[float]:
        """Each instance's reference pass (ms), timed one instance at a time so that none
        shares the cores with another: the speed of the machine, not of two engines on it
        (the simulator models that sharing itself)."""
        return [float(self._ray.get(a.speed_reference.remote(), timeout=120))
                for a in self.actors]

    def kill_instance(self, index: int) -> None:
        """Kills one actor (fault-injection for tests); the router finds out on its next call."""
        self._ray.kill(self.actors[index], no_restart=True)

    def stall_instance(self, index: int, seconds: float) -> None:
        """Fault injection for tests: instance `index` computes nothing for `seconds`."""
        self._ray.get(self.actors[index].stall.remote(seconds))

    def unstall_instance(self, index: int) -> None:
        """Ends `stall_instance(index, ...)` early."""
        self._ray.get(self.actors[index].unstall.remote())

    def close(self) -> None:
        self._stop.set()
        self._prober.join(timeout=self.probe_interval_s + 15)
        if self.tier is not None:
            self.tier.close()
        for a in self.actors:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        if self._owns_ray:
            self._ray.shutdown()
