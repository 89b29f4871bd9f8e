"""The router's picture of what each instance holds, kept from its own calls and answers.

Four parts, each learnt without asking the instances:
- item KV (`views.LiveInstance.cached`): the placement each store kept at start, then the
  candidates of every answer (misses are cached after it) less what the answer says the store
  lost;
- user sides (`views.UserResidency`, pointwise deployments): the instance that last prewarmed
  or ranked each user, while the side can serve the user's next request;
- beside a shared Redis tier (`tier.SharedTier`): what the tier holds, an item there local on
  every instance, and what a capped tier evicts leaves it (Redis' keyspace events);
- prompt prefixes (`rcllm.routing.prefixes.PrefixIndex`): the prefix chains of the exact
  prompts each instance computed (full, prefix: those its prefix cache inserts), bounded by
  that cache's capacity, as SGLang's cache-aware router keeps an approximate radix tree.
`view` turns it into the `rcllm.routing.ClusterView` a policy reads. Mutated only on the
router's event loop (the tier's own watcher thread aside: `tier.py`).
"""

from __future__ import annotations

from typing import Any

from ..config import PREFIX_INSERTING
from ..routing import ClusterView, RoutingRequest, SpeedProfile
from ..routing.prefixes import PrefixIndex
from .tier import SharedTier
from .views import LiveInstance, UserResidency, cluster_view



class Picture:
    def __init__(self, instances: list[LiveInstance], profile: SpeedProfile,
                 residency: UserResidency | None, tier: SharedTier | None,
                 prefixes: PrefixIndex | None = None) -> None:
        self.instances = instances
        self.profile = profile
        self.residency = residency      # None: no user-prefix cache (a listwise scorer)
        self.tier = tier                # None: no shared tier
        self.prefixes = prefixes        # None: the engines insert no prompts

    def view(self, live: list[LiveInstance], payload: dict[str, Any]) -> ClusterView:
        """The policy's view of `live` for `payload`: its user's side counts as held on the
        instance whose side can serve it (if any); a capped tier's evictions are applied
        first."""
        user = payload["user_id"]
        home = (self.residency.home(user, payload.get("history"))
                if self.residency is not None else None)
        if self.tier is not None:
            self.tier.drain()           # what a capped tier evicted leaves its picture
        return cluster_view(live, self.profile, user if home is not None else None, home,
                            self.prefixes)

    def answered(self, inst: LiveInstance, estimate_ms: float, ms: float, served: list[str],
                 lost: list[str] | None) -> None:
        """An answer: `inst`'s picture drops what its memory lost and takes the candidates,
        whose misses are written behind to the shared tier too, when there is one."""
        inst.finished(estimate_ms, ms, served, lost)
        if self.tier is not None:
            self.tier.added(served)

    def user_served(self, kind: str, inst: LiveInstance, payload: dict[str, Any],
                    out: dict[str, Any]) -> None:
        """After a prewarm, or a ranking that used the user-prefix cache, `inst` holds the
        user's side (for the history it was built from)."""
        if self.residency is not None and (
                kind == "prewarm" or out["stats"].get("user_prefix", "off") != "off"):
            self.residency.note(payload["user_id"], inst.index, payload.get("history"))

    def prewarm_sent(self, inst: LiveInstance, payload: dict[str, Any]) -> None:
        """A prewarm sent to `inst`: the user's side counts as held there now, before it is
        computed (the instance's engine runs its calls in turn, so a ranking sent after it
        finds it), and a relay's ranking that arrives meanwhile follows it."""
        if self.residency is not None:
            self.residency.note(payload["user_id"], inst.index, payload.get("history"))

    def prewarm_failed(self, inst: LiveInstance, payload: dict[str, Any]) -> None:
        """A prewarm sent to `inst` was refused or lost: its side is not there."""
        if self.residency is not None:
            self.residency.drop(payload["user_id"], inst.index)

    def prompt_served(self, inst: LiveInstance, request: RoutingRequest,
                      out: dict[str, Any]) -> None:
        """A ranking answered: with a method whose exact prompt `inst` inserts into its prefix
        cache, the request's prefix chain is held there now."""
        if self.prefixes is not None and out.get("method") in PREFIX_INSERTING:
            self.prefixes.insert(inst.index, request.prefix, request.prefix_tokens)

    def forget(self, index: int) -> None:
        """Instance `index` died: nothing of it is reusable any more."""
        if self.residency is not None:
            self.residency.forget_instance(index)
        if self.prefixes is not None:
            self.prefixes.forget(index)

    def items_submitted(self, ids: list[str], redis_keys: dict[str, str] | None) -> None:
        """New or changed items: every instance builds them (they count as held there), and
        beside a tier their new chunk keys are written behind to it (`redis_keys`)."""
        for inst in self.instances:
            inst.cached.update(ids)
        if self.tier is not None and redis_keys is not None:
            self.tier.joined(redis_keys)

    def item_deleted(self, item_id: str) -> None:
        for inst in self.instances:
            inst.cached.discard(item_id)
        if self.tier is not None:
            self.tier.discard(item_id)

    def tier_stats(self) -> dict[str, object] | None:
        return self.tier.stats([i.cached for i in self.instances]) if self.tier else None
