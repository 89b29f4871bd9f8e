"""What a served sweep runs (`rcllm bench serve --sweep`, loadgen/sweep.py): its series — a
method with its routing policy — and its rates, parsed from the command line.

Two kinds of series, told apart by each cell's `roles`: a *method* series is a method routed by
its own policy (`routing.registry.method_policy`); the *policy* series is one method (the
`--policy-method`, rcllm 0.3/0.3 by default) under each `--policies` policy. A cell may play
both roles: the policy series' cell under the method's own policy is the method series' cell.
Method names are checked against the engine's (`config.METHODS`) before anything starts. A
method series may name its policy, `METHOD@POLICY` (its series is then named so): the control
`prefix@load-only` routes prefix caching by load alone, beside `prefix` routed prefix-aware.
`exact-user` is routed by its user side (`user-side`); with a relay (`with_relay`) its user side
is prewarmed ahead of each ranking: the lossless peer, prefix caching with a relay in front.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..config import METHOD_ALIASES, METHODS, USER_SIDE_METHODS
from ..errors import RcllmError
from ..routing.registry import ITEM_POLICIES, check_policy, method_policy

# prefix is routed as deployed (prefix-aware); prefix@load-only is its load-only control
DEFAULT_METHODS = "full,prefix,prefix@load-only,rcllm:0.3:0.3,rcllm:0.15:0.15"
# every registered policy that reads item KV or load (routing/registry.py), in name order
DEFAULT_POLICIES = ",".join(sorted(ITEM_POLICIES))
DEFAULT_RATES = "0.4x,0.7x,1.0x,1.3x,1.6x,2.0x"
POLICY_METHOD = "rcllm:0.3:0.3"     # the method the policy series run by default


@dataclass(frozen=True)
class Series:
    name: str
    policy: str
    fields: dict = field(default_factory=dict)     # added to every body (method, ratios)
    method: str = "default"
    roles: tuple[str, ...] = ("method",)        # "method" and/or "policy" (module docstring)
    relay_lead_s: float | None = None   # a relay's prewarm leads each ranking by this; None: none

    def body(self, body: dict) -> dict:
        return {**body, **self.fields}


def parse_method(spec: str) -> tuple[str, dict]:
    """'full' | 'prefix' | 'rcllm:ITEM:HISTORY' | any engine method | 'adapter' (no method
    field: the served adapter's default, its fast path) → (name, body fields)."""
    parts = spec.split(":")
    if parts[0] == "adapter":
        return "adapter", {}
    if len(parts) == 3:
        try:
            item, hist = float(parts[1]), float(parts[2])
        except ValueError:
            raise RcllmError(f"method {spec!r}: use METHOD:ITEM_RATIO:HISTORY_RATIO") from None
        return (f"{parts[0]}-{item:g}/{hist:g}",
                {"method": parts[0], "item_ratio": item, "history_ratio": hist})
    if len(parts) != 1:
        raise RcllmError(f"method {spec!r}: use METHOD or METHOD:ITEM_RATIO:HISTORY_RATIO")
    return spec, {"method": spec}


def check_method(spec: str) -> tuple[str, dict]:
    """`parse_method(spec)` for a method the engine knows (or 'adapter'); RcllmError naming
    the known ones otherwise (before any model loads, not at the first request)."""
    name, fields = parse_method(spec)
    if fields.get("method", "adapter") not in (*METHODS, "adapter"):
        raise RcllmError(f"unknown method {spec.split(':')[0]!r} in {spec!r}; known: "
                         f"{', '.join(METHODS)}, adapter")
    return name, fields


def series_of(methods: str, policies: str, adapter: bool,
              policy_method: str = POLICY_METHOD) -> list[Series]:
    """The method series (each routed by the policy it names, else by
    `registry.method_policy`: full load-only, prefix prefix-aware, the rest affinity) and the
    policy series (`policy_method` under each policy; where a method
    series already is that method under that policy, it plays both roles)."""
    out: list[Series] = []
    specs = [m for m in methods.split(",") if m]
    if adapter and "adapter" not in specs:
        specs.append("adapter")
    for spec in specs:
        spec, _at, policy = spec.partition("@")
        name, fields = check_method(spec)
        base = fields.get("method", "adapter")
        if policy:
            out.append(Series(f"{name}@{check_policy(policy)}", policy, fields, base))
        else:
            out.append(Series(name, method_policy(base), fields, base))
    pname, pfields = check_method(policy_method)
    if pname == "adapter" and not adapter:
        raise RcllmError("--policy-method adapter needs --adapter")
    for policy in [p for p in policies.split(",") if p]:
        check_policy(policy)
        both = [k for k, s in enumerate(out) if s.name == pname and s.policy == policy]
        if both:
            out[both[0]] = dataclasses.replace(out[both[0]], roles=("method", "policy"))
            continue
        out.append(Series(pname, policy, pfields, pfields.get("method", "adapter"),
                          roles=("policy",)))
    if not out:
        raise RcllmError("the sweep needs at least one method or policy")
    return out


def check_user_sides(series: list[Series], scorer: str | None, adapter: bool) -> None:
    """RcllmError when a series needs the user-prefix cache (a relay's prewarm; exact-user)
    and the deployment's scorer keeps none. `scorer` as asked (None: an adapter's own, known
    only once it loads, so passed here; without an adapter the verbalizer): checked before
    any model loads, and again on the started deployment."""
    need = [f"{s.name} @ {s.policy}" for s in series
            if s.relay_lead_s is not None or s.method in METHOD_ALIASES]
    if need and scorer != "pointwise" and not (scorer is None and adapter):
        raise RcllmError(f"{', '.join(need)}: a relay's prewarm and exact-user need the "
                         f"pointwise scorer (the user-prefix cache), not {scorer or 'the default'}"
                         "; add --scorer pointwise")


def check_relay_lead(lead_s: float) -> float:
    """`lead_s` when it is a lead a relay can keep (finite, >= 0); RcllmError otherwise."""
    if not (isinstance(lead_s, (int, float)) and math.isfinite(lead_s) and lead_s >= 0):
        raise RcllmError(f"--relay-lead-s {lead_s!r}: the seconds a prewarm leads its "
                         "ranking, a finite number >= 0")
    return float(lead_s)


def with_relay(series: list[Series], lead_s: float | None,
               methods: str | None = None) -> list[Series]:
    """`series` with a relay in front of those whose method reads the user side
    (`USER_SIDE_METHODS`), or of those `methods` names (comma list of methods, as the series'
    `method`): each of their rankings' /v1/prewarm sent `lead_s` before it. RcllmError for a
    named method no series runs, or one that reads no user side; `lead_s` None: no relay
    (and no `methods`)."""
    if lead_s is None:
        if methods:
            raise RcllmError("--relay-methods needs --relay-lead-s")
        return series
    lead_s = check_relay_lead(lead_s)
    named = [m for m in (methods or "").split(",") if m]
    for m in named:
        if m not in USER_SIDE_METHODS:
            raise RcllmError(f"--relay-methods {m!r}: a relay prewarms the user side, which "
                             f"only {', '.join(USER_SIDE_METHODS)} read")
        if not any(s.method == m for s in series):
            raise RcllmError(f"--relay-methods {m!r}: no series of this sweep runs it")
    keep = set(named) if named else set(USER_SIDE_METHODS)
    return [dataclasses.replace(s, relay_lead_s=lead_s if s.method in keep else None)
            for s in series]


def parse_rates(spec: str) -> list[tuple[float, bool]]:
    """'0.5,1,2' (requests/s) or '0.3x,0.6x' (× capacity) → [(value, relative)]."""
    out = []
    for tok in [t for t in spec.split(",") if t]:
        rel = tok.endswith("x")
        try:
            value = float(tok[:-1] if rel else tok)
        except ValueError:
            raise RcllmError(f"--rates {tok!r}: a number, or a number then x") from None
        if value <= 0:
            raise RcllmError(f"--rates {tok!r} must be > 0")
        out.append((value, rel))
    if not out:
        raise RcllmError("--rates is empty")
    return out
