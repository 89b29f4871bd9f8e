"""Prometheus metrics of one app, in the app's own registry (no process-global state).

Names (all prefixed `rcllm_`): requests_total{endpoint,status}, rejected_total (429),
ttft_seconds (histogram), recomputed_fraction (histogram), chunk_lookups_total{result},
chunk_hit_ratio (cumulative, gauge), reused_tokens_total{kind}, recomputed_tokens_total{kind},
queue_depth (gauge), item_builds_pending (gauge); per chunk-store tier (label `tier`: memory,
memory-history, disk, redis): kv_tier_{hits,misses,corrupt,rejected,evictions,errors}_total and
kv_tier_{bytes,entries} (gauges), read from the store when scraped; the user-prefix cache
(pointwise scorer; summed over instances with Ray): userprefix_{hits,misses,expired,evictions,
spill_hits}_total, userprefix_{bytes,entries} (gauges), userprefix_hit_ratio; prewarms:
prewarm_total{result=computed|cached}.
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class TierCollector:
    """Per-tier store counters at scrape time, from `stats()` = kvstore.wiring.tier_stats."""

    def __init__(self, stats: Callable[[], dict[str, dict[str, int]]]) -> None:
        self.stats = stats

    def collect(self):
        rows = self.stats()
        names = sorted({k for row in rows.values() for k in row})
        for name in names:
            kind = GaugeMetricFamily if name in ("bytes", "entries") else CounterMetricFamily
            family = kind(f"rcllm_kv_tier_{name}", f"chunk store {name} per tier", labels=["tier"])
            for tier, row in rows.items():
                if name in row:
                    family.add_metric([tier], row[name])
            yield family


class UserPrefixCollector:
    """The user-prefix cache's counters at scrape time, from `stats()` (UserPrefixCache.stats,
    or None when the deployment has no user-prefix cache: nothing is exported)."""

    COUNTERS = ("hits", "misses", "expired", "evictions", "spill_hits")
    GAUGES = ("bytes", "entries")

    def __init__(self, stats: Callable[[], dict[str, float] | None]) -> None:
        self.stats = stats

    def collect(self):
        row = self.stats()
        if not row:
            return
        for name in self.COUNTERS:
            if name in row:
                c = CounterMetricFamily(f"rcllm_userprefix_{name}",
                                        f"user-prefix cache {name}")
                c.add_metric([], row[name])
                yield c
        for name in self.GAUGES:
            if name in row:
                yield GaugeMetricFamily(f"rcllm_userprefix_{name}",
                                        f"user-prefix cache {name} now", value=row[name])
        looked = row.get("hits", 0) + row.get("misses", 0)
        yield GaugeMetricFamily("rcllm_userprefix_hit_ratio",
                                "user-prefix hits / ranking lookups since start",
                                value=row.get("hits", 0) / looked if looked else 0.0)


class Metrics:
    def __init__(self, queue_depth: Callable[[], int], pending: Callable[[], int],
                 store_stats: Callable[[], dict[str, dict[str, int]]] | None = None,
                 user_prefix_stats: Callable[[], dict[str, float] | None] | None = None
                 ) -> None:
        r = self.registry = CollectorRegistry()
        if store_stats is not None:
            r.register(TierCollector(store_stats))
        if user_prefix_stats is not None:
            r.register(UserPrefixCollector(user_prefix_stats))
        self.prewarms = Counter("rcllm_prewarm", "POST /v1/prewarm answered, by whether the "
                                "user side was computed or already cached", ["result"],
                                registry=r)
        self.requests = Counter("rcllm_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.rejected = Counter("rcllm_rejected", "requests refused with 429 (queue full)",
                                registry=r)
        self.ttft = Histogram("rcllm_ttft_seconds", "time to first token of /v1/rank",
                              buckets=TTFT_BUCKETS_S, registry=r)
        self.recomputed = Histogram("rcllm_recomputed_fraction",
                                    "fraction of prompt tokens recomputed per request",
                                    buckets=[i / 10 for i in range(1, 11)], registry=r)
        self.lookups = Counter("rcllm_chunk_lookups", "chunk store lookups by result",
                               ["result"], registry=r)
        self.reused = Counter("rcllm_reused_tokens", "tokens whose KV was reused, by kind",
                              ["kind"], registry=r)
        self.recomputed_tokens = Counter("rcllm_recomputed_tokens",
                                         "tokens computed by the prefill, by kind", ["kind"],
                                         registry=r)
        self.hit_ratio = Gauge("rcllm_chunk_hit_ratio", "chunk hits / lookups since start",
                               registry=r)
        Gauge("rcllm_queue_depth", "requests admitted, waiting or running",
              registry=r).set_function(queue_depth)
        Gauge("rcllm_item_builds_pending", "item KV builds not yet swapped in",
              registry=r).set_function(pending)
        self._hits = 0
        self._lookups = 0

    def observe_rank(self, out: dict[str, Any]) -> None:
        st = out["stats"]
        self.ttft.observe(out["ttft_ms"] / 1e3)
        self.recomputed.observe(st.get("recomputed_fraction", 1.0))
        hits, misses = st.get("chunk_hits", 0), st.get("chunk_misses", 0)
        self.lookups.labels("hit").inc(hits)
        self.lookups.labels("miss").inc(misses)
        self._hits += hits
        self._lookups += hits + misses
        if self._lookups:
            self.hit_ratio.set(self._hits / self._lookups)
        for kind, n in st.get("reused_tokens", {}).items():
            self.reused.labels(kind).inc(n)
        for kind, n in st.get("recomputed_by_kind", {}).items():
            self.recomputed_tokens.labels(kind).inc(n)

    def observe_prewarm(self, out: dict[str, Any]) -> None:
        self.prewarms.labels("computed" if out["computed"] else "cached").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
