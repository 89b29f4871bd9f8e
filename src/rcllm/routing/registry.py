"""The routing policies by name: the one list that the CLI (`serve --policy`), the served sweep
(`loadgen.series`, `loadgen.targets`), the simulator (`sim.experiments`) and the benchmarks
(`bench.sim`) read. A policy is added here once, with what its choice reads, and every reader
sees it; nothing else spells the names out (issue 62 item 4; LMCache builds its backend chain
from configuration in the same way).

`reads` says what a policy's choice depends on beyond the request: "order" (the arrival order
alone), "load" (the instances' outstanding work), "items" (the item KV each holds, and load),
"prefixes" (the prefix caches' picture, `prefixes.PrefixIndex`, and load), "users" (where
each user's user side is, `serve.views.UserResidency`, and load). The simulator's cluster views
carry load and items, neither a prefix picture nor user sides: `ITEM_POLICIES` run there.

It also says which series of a served sweep a cell belongs to (`in_role`): the sweep
(`loadgen`) and the simulator's plots (`sim.plots`) read one rule, and the simulator may not
import the load generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import RcllmError
from .cost import CostModel
from .policies import (Affinity, CostBased, HitOnly, LoadOnly, PrefixAware, RoundRobin,
                       RoutingPolicy, UserSide)


@dataclass(frozen=True)
class PolicyOptions:
    """The knobs a policy may take (each policy reads its own)."""

    w_hit: float = 1.0              # affinity's hit weight
    w_idle: float | None = 4.0      # affinity's idleness weight; None: derived per decision
    prefix_max_extra: int = 1       # prefix-aware: queued requests a match may add
    user_max_extra: int = 1         # user-side: queued requests a held user side may add


@dataclass(frozen=True)
class PolicySpec:
    name: str
    make: Callable[[CostModel, PolicyOptions], RoutingPolicy]
    reads: str          # "order" | "load" | "items" | "prefixes" | "users" (module docstring)
    summary: str                    # one line, for --help and the docs


_SPECS = (
    PolicySpec(RoundRobin.name, lambda cost, o: RoundRobin(), "order",
               "instances in turn, blind to load and caches"),
    PolicySpec(LoadOnly.name, lambda cost, o: LoadOnly(), "load",
               "the least outstanding work; misses caches"),
    PolicySpec(HitOnly.name, lambda cost, o: HitOnly(), "items",
               "the most local item tokens; piles requests onto hot nodes"),
    PolicySpec(Affinity.name, lambda cost, o: Affinity(cost, o.w_hit, o.w_idle), "items",
               "RcLLM's hit rate x idleness, its balance derived from the cost model"),
    PolicySpec(CostBased.name, lambda cost, o: CostBased(cost), "items",
               "the lowest TTFT the cost model estimates (queue + service there)"),
    PolicySpec(PrefixAware.name, lambda cost, o: PrefixAware(o.prefix_max_extra), "prefixes",
               "the longest cached prompt prefix unless its queue is longer (SGLang, llm-d)"),
    PolicySpec(UserSide.name, lambda cost, o: UserSide(o.user_max_extra), "users",
               "the instance holding the user side (a relay's prewarm) unless its queue is "
               "longer"),
)
REGISTRY: dict[str, PolicySpec] = {s.name: s for s in _SPECS}

POLICIES = tuple(REGISTRY)
# those that read no more than item KV and load: they run on any cluster view (the
# simulator's) and form the served sweep's policy series (its method reads item KV)
ITEM_POLICIES = tuple(n for n, s in REGISTRY.items() if s.reads in ("order", "load", "items"))
# blind to what the instances hold: the served replay can simulate them without the caches
CACHE_BLIND = tuple(n for n, s in REGISTRY.items() if s.reads in ("order", "load"))
# the policy a method series of the served sweep is routed by (the rest: DEFAULT_POLICY): full
# reads no cache, so load decides; prefix is routed as it is deployed, prefix-aware; exact-user
# reads only the user side from the user-prefix cache (every candidate computed), so it goes
# where that side is, as behind a relay
METHOD_POLICIES = {"full": LoadOnly.name, "prefix": PrefixAware.name,
                   "exact-user": UserSide.name}
DEFAULT_POLICY = Affinity.name
# the policy series' name in served sweeps recorded before cells carried their roles
LEGACY_POLICY_SERIES = "rcllm-0.3/0.3"


def method_policy(method: str) -> str:
    """The policy the served sweep routes method `method`'s own series by."""
    return METHOD_POLICIES.get(method, DEFAULT_POLICY)


def in_role(cell: dict, role: str) -> bool:
    """Whether a served sweep's cell belongs to a method series (`role` "method") or to the
    policy series ("policy"), as its `roles` say. A cell recorded before cells carried their
    roles: the policy series is rcllm 0.3/0.3, its affinity cell the method series' own."""
    if "roles" in cell:
        return role in cell["roles"]
    policy = cell["method"] == LEGACY_POLICY_SERIES
    return policy if role == "policy" else (not policy or cell["policy"] == method_policy(
        "rcllm"))


def check_policy(name: str) -> str:
    """`name` when it is a registered policy; RcllmError naming the known ones otherwise."""
    if name not in REGISTRY:
        raise RcllmError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return name


def routing_policy(name: str, cost: CostModel, w_hit: float = 1.0,
                   w_idle: float | None = 4.0) -> RoutingPolicy:
    """A fresh policy object by name (one of POLICIES); `w_idle` None: affinity's idleness
    weight derived from the cost model at each decision (balance.py)."""
    return REGISTRY[check_policy(name)].make(cost, PolicyOptions(w_hit, w_idle))
