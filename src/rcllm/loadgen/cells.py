"""The numbers of one cell of a served sweep, read off its per-request rows (loadgen/sweep.py
runs the cells; `targets.reread` recomputes them at another SLO).

Per cell: TTFT as the client sees it (arrival to answer: the ranking is the first token; queue
and HTTP included) P50/P90/P99 with a bootstrap 90% interval of P50 and P99, the engine's own
TTFT and the CPU its thread used to reach it (lower: it waited for a core), queue time (client
latency - engine time), goodput (answered within `--slo-ms` per second of the cell's wall time)
and SLO attainment, chunk and user-prefix hit ratios, the prefix cache's hit ratio beyond the
instruction (`prefix_metrics`), 429s, 5xx and lost requests (transport
errors or timeouts). Where the hits came from (`miss_metrics`): chunk hits and misses, the item
tokens computed on the spot because their chunk missed, the item KV imported between instances
(items, and the time the imports took, waits for an engine lock apart) and the TTFT the missed
item tokens cost, as the router's cost model prices them (`miss_cost_ms` of each row, set by
the sweep from `routing.balance.miss_cost_ms`; the profile is the router's, fitted on its
calibration run). With a relay in front (`bench serve --sweep --relay-lead-s S`), the prewarms
and their engine time (`relay_metrics`): `goodput_rps` stays the rankings answered within the
SLO per second of the cell's wall time (from the first ranking's send; the prewarms' work shows
in it as the queueing it causes, since they run on the same engines and the router counts them
in each instance's load), and `goodput_per_engine_s` charges their engine time explicitly.
"""

from __future__ import annotations

import numpy as np

TABLE = ("rate_rps", "series", "method", "policy", "sent", "ok", "rejected_429", "errors_5xx",
         "lost", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "engine_ttft_p50_ms",
         "engine_cpu_p50_ms", "queue_p50_ms", "queue_p99_ms", "goodput_rps", "slo_attainment",
         "chunk_hit_ratio", "item_token_hit_ratio", "item_miss_tokens", "kv_imported_items",
         "miss_cost_p50_ms",
         "user_prefix_hit_ratio", "user_prefix_append_ratio", "prefix_hit_ratio",
         "prefix_hit_requests", "prewarms", "prewarm_errors", "prewarm_engine_ms",
         "goodput_per_engine_s", "served_ndcg10", "per_instance", "held_items",
         "tier_items")


def _pct(xs: np.ndarray, q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


def _draws(n: int, draws: int, seed: int) -> np.ndarray:
    """Bootstrap row indices [draws, n] (the same for a seed, whatever is resampled)."""
    return np.random.default_rng(seed).integers(0, n, size=(draws, n))


def percentile_interval(stats: np.ndarray, level: float = 0.9) -> list[float]:
    """The central `level` interval of bootstrap statistics."""
    lo = (1 - level) / 2 * 100
    return [float(np.percentile(stats, lo)), float(np.percentile(stats, 100 - lo))]


def bootstrap_interval(xs: np.ndarray, q: float, level: float = 0.9, draws: int = 1000,
                       seed: int = 0) -> list[float]:
    """Percentile-bootstrap interval of the q-th percentile of `xs`."""
    if len(xs) < 2:
        return [float("nan"), float("nan")]
    return percentile_interval(np.percentile(xs[_draws(len(xs), draws, seed)], q, axis=1), level)


def mean_interval(xs: np.ndarray, level: float = 0.9, draws: int = 1000,
                  seed: int = 0) -> list[float]:
    """Percentile-bootstrap interval of the mean of `xs`."""
    return percentile_interval(xs[_draws(len(xs), draws, seed)].mean(axis=1), level)


def ratio_interval(num: np.ndarray, den: np.ndarray, level: float = 0.9, draws: int = 1000,
                   seed: int = 0) -> list[float]:
    """Percentile-bootstrap interval of sum(num) / sum(den) over the same resampled rows."""
    if len(num) < 2:
        return [float("nan"), float("nan")]
    idx = _draws(len(num), draws, seed)
    return percentile_interval(num[idx].sum(axis=1) / np.maximum(den[idx].sum(axis=1), 1e-12),
                               level)


def cell_metrics(rows: list[dict], wall_s: float, slo_ms: float,
                 instruction_tokens: int | None = None,
                 prewarms: list[dict] | None = None) -> dict:
    """The per-cell numbers of one load's per-request rows (module docstring);
    `instruction_tokens`: the instruction's tokens every prefix cache holds from start-up
    (None: unknown, no prefix hit ratio); `prewarms`: the relay's prewarm rows (None or
    empty: no relay), counted by `relay_metrics`."""
    ok = [r for r in rows if r["status"] == 200]
    lat = np.array([r["latency_ms"] for r in ok])
    eng = np.array([r["ttft_ms"] for r in ok])
    cpu = np.array([r["thread_cpu_ms"] for r in ok if "thread_cpu_ms" in r])
    split = [(r["ttft_ms"], r["thread_cpu_ms"], r["run_wait_ms"]) for r in ok
             if r.get("run_wait_ms") is not None]
    wall_cpu_wait = np.array(split).sum(axis=0) if split else None
    queue = np.array([max(0.0, r["latency_ms"] - r["total_ms"]) for r in ok])
    within = int((lat <= slo_ms).sum()) if len(lat) else 0
    up = [r["user_prefix"] for r in ok if r.get("user_prefix", "off") != "off"]
    return {"sent": len(rows), "ok": len(ok),
            "rejected_429": sum(r["status"] == 429 for r in rows),
            "errors_5xx": sum(r["status"] >= 500 for r in rows),
            "lost": sum(r["status"] == -1 for r in rows),
            "other_4xx": sum(400 <= r["status"] < 500 and r["status"] != 429 for r in rows),
            "wall_s": wall_s,
            "ttft_p50_ms": _pct(lat, 50), "ttft_p90_ms": _pct(lat, 90),
            "ttft_p99_ms": _pct(lat, 99),
            "ttft_p50_ci90": bootstrap_interval(lat, 50),
            "ttft_p99_ci90": bootstrap_interval(lat, 99),
            "engine_ttft_p50_ms": _pct(eng, 50), "engine_ttft_p99_ms": _pct(eng, 99),
            # CPU its engine thread used to the first token (below the engine TTFT: it waited
            # for a core; the same: it computed the whole time)
            "engine_cpu_p50_ms": _pct(cpu, 50),
            # of the engine threads' time to the first token, the shares spent computing,
            # runnable but waiting for a core, and blocked (I/O, locks); None: not reported
            "engine_time_split": None if wall_cpu_wait is None else {
                "cpu": float(wall_cpu_wait[1] / wall_cpu_wait[0]),
                "run_wait": float(wall_cpu_wait[2] / wall_cpu_wait[0]),
                "blocked": float(1 - (wall_cpu_wait[1] + wall_cpu_wait[2]) / wall_cpu_wait[0])},
            "queue_p50_ms": _pct(queue, 50), "queue_p99_ms": _pct(queue, 99),
            "goodput_rps": within / wall_s if wall_s > 0 else 0.0,
            "slo_attainment": within / max(1, len(rows)),
            "chunk_hit_ratio": sum(r["hits"] for r in ok) / max(1, sum(r["lookups"] for r in ok)),
            **miss_metrics(ok), **prefix_metrics(ok, instruction_tokens),
            **relay_metrics(ok, prewarms or [], within), **served_quality(ok),
            "user_prefix_hit_ratio": (sum(u == "hit" for u in up) / len(up)) if up else None,
            # a returning user's history has grown by the last review: at best an append
            "user_prefix_append_ratio": (sum(u == "append" for u in up) / len(up)) if up
            else None,
            "per_instance": {str(k): sum(r["instance"] == k for r in ok)
                             for k in sorted({r["instance"] for r in ok})}}


def miss_metrics(ok: list[dict]) -> dict:
    """Where the answered requests' KV came from (module docstring): chunk hits and misses,
    item tokens computed on the spot, item KV imported between instances and the time the
    imports took, and the TTFT the misses cost (P50, mean, and their share of the engine's
    TTFT; None where the rows do not say: a sweep recorded before these fields)."""
    def total(key: str) -> float:
        return float(sum(r.get(key) or 0 for r in ok))

    cost = np.array([r["miss_cost_ms"] for r in ok if r.get("miss_cost_ms") is not None])
    engine_ms = total("ttft_ms")
    # the share of the candidates' item tokens served from a store, with its 90% interval
    # over the requests (what a routing policy's locality wins)
    items = np.array([float(r.get("item_tokens") or 0) for r in ok])
    held = items - np.array([float(r.get("item_miss_tokens") or 0) for r in ok])
    n_items = float(items.sum())
    return {"chunk_hits": int(total("hits")),
            "chunk_misses": int(total("lookups") - total("hits")),
            "item_miss_tokens": int(total("item_miss_tokens")),
            "item_tokens": int(n_items),
            "item_token_hit_ratio": float(held.sum() / n_items) if n_items > 0 else None,
            "item_token_hit_ci90": ratio_interval(held, items) if n_items > 0 else None,
            "kv_imported_items": int(total("fetched")),
            "kv_import_ms": total("import_ms"), "kv_import_wait_ms": total("import_wait_ms"),
            "kv_imports_late": int(total("imports_late")),
            "miss_cost_p50_ms": _pct(cost, 50) if len(cost) else None,
            "miss_cost_mean_ms": float(cost.mean()) if len(cost) else None,
            "miss_cost_share": float(cost.sum() / engine_ms) if len(cost) and engine_ms > 0
            else None}



def served_gain(top10: list[str], target: str) -> float:
    """NDCG@10 of one ranking with one relevant item: 1 / log2(position + 2) in its top ten."""
    return 1.0 / float(np.log2(top10.index(target) + 2)) if target in top10[:10] else 0.0


def served_quality(ok: list[dict]) -> dict:
    """What was served, scored: `served_ndcg10` and `served_hr10`, each answered ranking's top
    ten (`top10`) against the trace's reviewed item (`target`, set by the sweep), with a 90%
    bootstrap interval of the NDCG's mean (`served_ndcg10_ci90`) over `served_n` rankings. The
    series of one sweep serve the same trace, so two cells at one rate compare request by
    request. None where the rows do not say (a sweep recorded before these fields)."""
    rows = [r for r in ok if r.get("target") is not None and "top10" in r]
    if not rows:
        return {"served_ndcg10": None, "served_ndcg10_ci90": None, "served_hr10": None,
                "served_n": 0}
    gains = np.array([served_gain(r["top10"], r["target"]) for r in rows])
    return {"served_ndcg10": float(gains.mean()), "served_ndcg10_ci90": mean_interval(gains),
            "served_hr10": float(np.mean([r["target"] in r["top10"][:10] for r in rows])),
            "served_n": len(rows)}


def prefix_metrics(ok: list[dict], instruction_tokens: int | None) -> dict:
    """The prefix cache's hits beyond the instruction's blocks (inserted at start-up, they
    would make any ratio non-zero): `prefix_hit_ratio`, the prompts' tokens past the
    instruction served from the prefix cache over all their tokens past it, and
    `prefix_hit_requests`, the share of requests with any such hit. None where unknown: no
    `instruction_tokens`, or rows recorded before they carried `prefix_tokens`."""
    rows = [r for r in ok if "prefix_tokens" in r and "context_tokens" in r]
    if instruction_tokens is None or not rows:
        return {"prefix_hit_ratio": None, "prefix_hit_requests": None}
    beyond = [max(0, r["prefix_tokens"] - instruction_tokens) for r in rows]
    past = sum(max(0, r["context_tokens"] - instruction_tokens) for r in rows)
    return {"prefix_hit_ratio": sum(beyond) / past if past else 0.0,
            "prefix_hit_requests": sum(b > 0 for b in beyond) / len(rows)}


def relay_metrics(ok: list[dict], prewarms: list[dict], within: int) -> dict:
    """The relay's prewarms and the engine time they cost (module docstring): `prewarms`
    sent, `prewarm_ok`, `prewarm_errors` (the rest: 429, 4xx, 5xx, lost; each ranking is sent
    whatever its prewarm's fate), `prewarm_computed` (answered by computing the user side, not
    finding it cached), `prewarm_engine_ms` (the engines' time on them, summed),
    `prewarm_ready` (of the rankings, the share whose prewarm had answered when they were sent)
    and `prewarm_followed` (of the answered rankings whose prewarm was answered, the share
    served on the prewarm's instance); `rank_engine_ms` (the answered rankings' engine time,
    summed) and `goodput_per_engine_s`: the rankings answered within the SLO (`within`) per
    second of engine time, the prewarms' included, so a relay that moves work out of the
    ranking's TTFT is charged for it. Without a relay the prewarm fields are 0 or None."""
    answered = [p for p in prewarms if p["status"] == 200]
    pre_ms = float(sum(p.get("engine_ms", 0.0) for p in answered))
    rank_ms = float(sum(r["total_ms"] for r in ok))
    linked = [r for r in ok if r.get("prewarm_instance") is not None]
    return {"prewarms": len(prewarms), "prewarm_ok": len(answered),
            "prewarm_errors": len(prewarms) - len(answered),
            "prewarm_computed": sum(bool(p.get("computed")) for p in answered),
            "prewarm_engine_ms": pre_ms, "rank_engine_ms": rank_ms,
            "prewarm_ready": (sum(bool(r.get("prewarm_ready")) for r in ok) / len(ok))
            if prewarms and ok else None,
            "prewarm_followed": (sum(r["instance"] == r["prewarm_instance"] for r in linked)
                                 / len(linked)) if linked else None,
            "goodput_per_engine_s": within / ((rank_ms + pre_ms) / 1e3)
            if rank_ms + pre_ms > 0 else 0.0}
