"""Prometheus metrics of one app, in the app's own registry (no process-global state).

Names (all prefixed `rcllm_`): requests_total{endpoint,status}, rejected_total (429),
ttft_seconds (histogram), recomputed_fraction (histogram), chunk_lookups_total{result},
chunk_hit_ratio (cumulative, gauge), reused_tokens_total{kind}, recomputed_tokens_total{kind},
queue_depth (gauge), item_builds_pending (gauge); per chunk-store tier (label `tier`: memory,
memory-history, disk, redis): kv_tier_{hits,misses,corrupt,rejected,evictions,errors}_total,
kv_tier_{bytes,entries} (gauges) and kv_tier_{get,put}_seconds (histograms; tier `all` = the
whole lookup), the disk tier's kv_tier_kind_{hits,puts}_total / kv_tier_kind_bytes{tier,kind},
kv_build_{queued,built,shared,dropped,errors}_total and kv_build_queue (misses built behind
the request), cache_{hits,misses}_total / cache_bytes{kind=item|history|user_prefix}, all read
from the store when scraped (`StoreCollector`); the user-prefix cache
(pointwise scorer; summed over instances with Ray): userprefix_{hits,misses,expired,evictions,
spill_hits}_total, userprefix_{bytes,entries} (gauges), userprefix_hit_ratio; prewarms:
prewarm_total{result=computed|cached}.
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


TIER_COUNTERS = ("hits", "misses", "corrupt", "rejected", "evictions", "errors")
FRONT = "all"        # kvstore.wiring.tier_stats' row of the whole store (StoreFront)


def _histogram(name: str, doc: str, rows: dict[str, dict[str, float]], op: str):
    """A histogram family per tier from the flat `<op>_le_<bound>`, `<op>_count`,
    `<op>_sum_s` numbers of kvstore.latency.TierLatency.row (summed over instances)."""
    family = HistogramMetricFamily(name, doc, labels=["tier"])
    prefix = f"{op}_le_"
    for tier, row in rows.items():
        if f"{op}_count" not in row:
            continue
        buckets = sorted(((k[len(prefix):], v) for k, v in row.items() if k.startswith(prefix)),
                         key=lambda b: float(b[0]))
        family.add_metric([tier], buckets + [("+Inf", row[f"{op}_count"])],
                          sum_value=row[f"{op}_sum_s"])
    return family


def _by_kind(rows: dict[str, dict[str, float]], counter: str) -> dict[tuple[str, str], float]:
    """{(tier, kind): n} of the `kind_<counter>:<kind>` numbers."""
    prefix = f"kind_{counter}:"
    return {(tier, k[len(prefix):]): v for tier, row in rows.items()
            for k, v in row.items() if k.startswith(prefix)}


class StoreCollector:
    """The chunk store at scrape time, from `stats()` = kvstore.wiring.tier_stats (summed over
    instances with Ray): per tier, its counters, bytes, entries and get/put latency
    histograms (tier `all` = the whole lookup, as the engine sees it); the disk tier's hits,
    puts and bytes per chunk kind; the build-behind queue; and per cache kind (item, history,
    user_prefix) hits, misses and bytes, the user prefix's from `user_prefix_stats()`."""

    def __init__(self, stats: Callable[[], dict[str, dict[str, float]]],
                 user_prefix_stats: Callable[[], dict[str, float] | None] | None = None) -> None:
        self.stats = stats
        self.user_prefix_stats = user_prefix_stats

    def collect(self):
        rows = self.stats()
        tiers = {t: r for t, r in rows.items() if t != FRONT}
        for name in (*TIER_COUNTERS, "bytes", "entries"):
            kind = GaugeMetricFamily if name in ("bytes", "entries") else CounterMetricFamily
            family = kind(f"rcllm_kv_tier_{name}", f"chunk store {name} per tier", labels=["tier"])
            present = False
            for tier, row in tiers.items():
                if name in row:
                    family.add_metric([tier], row[name])
                    present = True
            if present:
                yield family
        for op in ("get", "put"):
            yield _histogram(f"rcllm_kv_tier_{op}_seconds", f"chunk store {op} latency per tier "
                             f"(tier all: the whole {op} as the engine sees it)", rows, op)
        for counter in ("hits", "puts", "bytes"):
            found = _by_kind(tiers, counter)
            if not found:
                continue
            kind = GaugeMetricFamily if counter == "bytes" else CounterMetricFamily
            family = kind(f"rcllm_kv_tier_kind_{counter}", f"chunk store {counter} per tier "
                          "and chunk kind (disk tier)", labels=["tier", "kind"])
            for (tier, k), n in sorted(found.items()):
                family.add_metric([tier, k], n)
            yield family
        front = rows.get(FRONT)
        if front is not None:
            for name in ("queued", "built", "shared", "dropped", "errors"):
                yield CounterMetricFamily(f"rcllm_kv_build_{name}", f"chunk builds behind the "
                                          f"request: {name}", value=front.get(f"build_{name}", 0))
            yield GaugeMetricFamily("rcllm_kv_build_queue", "chunk builds waiting or running",
                                    value=front.get("build_queue", 0))
            yield GaugeMetricFamily("rcllm_kv_write_pending", "stored entries whose lower-tier "
                                    "(disk, Redis) writes are still queued",
                                    value=front.get("write_pending", 0))
        yield from self._cache_kinds(rows)

    def _cache_kinds(self, rows):
        """rcllm_cache_{hits,misses}_total and rcllm_cache_bytes by kind = item | history |
        user_prefix: every cache a request looks up, in one family."""
        hits = CounterMetricFamily("rcllm_cache_hits", "request-path cache hits by kind",
                                   labels=["kind"])
        misses = CounterMetricFamily("rcllm_cache_misses", "request-path cache misses by kind",
                                     labels=["kind"])
        size = GaugeMetricFamily("rcllm_cache_bytes", "bytes held in memory by cache kind",
                                 labels=["kind"])
        front = rows.get(FRONT, {})
        for kind in ("item", "history"):
            hits.add_metric([kind], front.get(f"kind_hits:{kind}", 0))
            misses.add_metric([kind], front.get(f"kind_misses:{kind}", 0))
        if "memory-history" in rows:      # memory split by kind (the server's store)
            size.add_metric(["item"], rows.get("memory", {}).get("bytes", 0))
            size.add_metric(["history"], rows["memory-history"].get("bytes", 0))
        up = self.user_prefix_stats() if self.user_prefix_stats is not None else None
        if up:
            hits.add_metric(["user_prefix"], up.get("hits", 0))
            misses.add_metric(["user_prefix"], up.get("misses", 0))
            size.add_metric(["user_prefix"], up.get("bytes", 0))
        yield hits
        yield misses
        yield size


class _RowCollector:
    """Families made from one stats row read at scrape time by the subclass's `families(row)`;
    a None or empty row exports nothing."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None]) -> None:
        self.stats = stats

    def collect(self):
        row = self.stats()
        if row:
            yield from self.families(row)


class UserPrefixCollector(_RowCollector):
    """The user-prefix cache's counters at scrape time, from `stats()` (UserPrefixCache.stats,
    or None when the deployment has no user-prefix cache: nothing is exported)."""

    COUNTERS = ("hits", "misses", "expired", "evictions", "spill_hits")
    GAUGES = ("bytes", "entries")

    def families(self, row: dict[str, Any]):
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


class TierPictureCollector(_RowCollector):
    """The router's picture of a shared Redis tier (`serve.tier.SharedTier.stats`): the items
    it counts as held, the evictions and expiries it learnt from Redis, its resyncs and watch
    errors, and whether it is watching now (0 means evictions go unlearnt). Nothing without a
    shared tier."""

    COUNTERS = ("evicted", "expired", "resyncs", "watch_errors")

    def families(self, row: dict[str, Any]):
        for name in self.COUNTERS:
            yield CounterMetricFamily(f"rcllm_router_tier_{name}", f"shared tier {name} the "
                                      "router learnt", value=row[f"tier_{name}"])
        yield GaugeMetricFamily("rcllm_router_tier_items", "items the router counts as held "
                                "by the shared tier", value=row["tier_items"])
        yield GaugeMetricFamily("rcllm_router_tier_watching", "1 while the router reads the "
                                "tier's eviction events", value=float(row["tier_watching"]))


class Metrics:
    def __init__(self, queue_depth: Callable[[], int], pending: Callable[[], int],
                 store_stats: Callable[[], dict[str, dict[str, int]]] | None = None,
                 user_prefix_stats: Callable[[], dict[str, float] | None] | None = None,
                 tier_stats: Callable[[], dict[str, Any] | None] | None = None) -> None:
        r = self.registry = CollectorRegistry()
        if store_stats is not None:
            r.register(StoreCollector(store_stats, user_prefix_stats))
        if user_prefix_stats is not None:
            r.register(UserPrefixCollector(user_prefix_stats))
        if tier_stats is not None:
            r.register(TierPictureCollector(tier_stats))
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
