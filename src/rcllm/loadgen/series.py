"""What a served sweep runs (`rcllm bench serve --sweep`, loadgen/sweep.py): its series — a
method with its routing policy — and its rates, parsed from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import RcllmError
from ..routing.registry import POLICIES, check_policy, method_policy

DEFAULT_METHODS = "full,prefix,rcllm:0.3:0.3,rcllm:0.15:0.15"
# every registered policy (routing/registry.py), in name order
DEFAULT_POLICIES = ",".join(sorted(POLICIES))
DEFAULT_RATES = "0.4x,0.7x,1.0x,1.3x,1.6x,2.0x"
POLICY_METHOD = "rcllm:0.3:0.3"     # the method the policy series run


@dataclass(frozen=True)
class Series:
    name: str
    policy: str
    fields: dict = field(default_factory=dict)     # added to every body (method, ratios)
    method: str = "default"

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


def series_of(methods: str, policies: str, adapter: bool) -> list[Series]:
    """The method series (each routed by `registry.method_policy`: full/prefix load-only, the
    rest by affinity) and the policy series (rcllm 0.3/0.3 under each policy; its affinity
    cell is the method series' own)."""
    out: list[Series] = []
    specs = [m for m in methods.split(",") if m]
    if adapter and "adapter" not in specs:
        specs.append("adapter")
    for spec in specs:
        name, fields = parse_method(spec)
        base = fields.get("method", "adapter")
        out.append(Series(name, method_policy(base), fields, base))
    pname, pfields = parse_method(POLICY_METHOD)
    for policy in [p for p in policies.split(",") if p]:
        check_policy(policy)
        if any(s.name == pname and s.policy == policy for s in out):
            continue
        out.append(Series(pname, policy, pfields, "rcllm"))
    if not out:
        raise RcllmError("the sweep needs at least one method or policy")
    return out


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
