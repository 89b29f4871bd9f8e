"""An open-loop load generator over HTTP: requests at a fixed rate, bounded in count and time.

Open loop (arrivals do not wait for answers), so queueing and 429s show up as they would
with independent clients. Every request is accounted for: answered (200), refused (429),
refused for bad input (4xx) or failed (5xx / transport error).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

import httpx
import numpy as np

from ..serve.server import KEEP_ALIVE_S

# the client drops an idle connection well before the server would (no close race)
KEEPALIVE_EXPIRY_S = min(5.0, KEEP_ALIVE_S / 4)


def _asked(body: dict) -> dict[str, Any]:
    """What a row keeps of its request, for the simulator's replay of the caches: the user, the
    candidate ids and the reviewed items of the history (a history chunk's content)."""
    return {"user": body.get("user_id"), "items": list(body.get("candidates", ())),
            "history_items": [h.get("item_id") for h in body.get("history", ())]}


async def _one(client: httpx.AsyncClient, body: dict) -> dict[str, Any]:
    sent = time.perf_counter()
    try:
        r = await client.post("/v1/rank", json=body)
    except httpx.HTTPError as exc:
        return {"status": -1, "error": type(exc).__name__, **_asked(body)}
    out = {"status": r.status_code, "latency_ms": (time.perf_counter() - sent) * 1e3,
           **_asked(body)}
    if r.status_code == 200:
        js = r.json()
        st = js["stats"]
        out.update(ttft_ms=js["ttft_ms"], total_ms=js["total_ms"], instance=js["instance"],
                   recomputed_fraction=st["recomputed_fraction"], hits=st["chunk_hits"],
                   lookups=st["chunk_hits"] + st["chunk_misses"],
                   fetched=st.get("fetched_items", 0), **_item_tokens(st),
                   user_prefix=st.get("user_prefix", "off"), method=js.get("method"),
                   context_tokens=st.get("tokens", 0), prefix_tokens=st.get("prefix_tokens", 0),
                   recomputed_tokens=st.get("recomputed_tokens", 0),
                   behind_tokens=st.get("behind_tokens", []),
                   **{k: st[k] for k in ("build_ms", "assemble_ms", "prefill_ms",
                                         "thread_cpu_ms", "run_wait_ms", "after_ms",
                                         "import_wait_ms", "import_ms", "imports_late",
                                         "import_owner_wait_ms", "lock_wait_ms",
                                         "actor_ms") if k in st})
    return out


def _item_tokens(st: dict) -> dict[str, int]:
    """A request's item tokens, and those not taken from the chunk store (missed chunks
    computed on the spot; with `reuse.item_tail` the tails too). A method that looks nothing
    up (full, prefix) misses nothing."""
    items = int((st.get("tokens_by_kind") or {}).get("item", 0))
    reused = int((st.get("reused_tokens") or {}).get("item", 0))
    looked_up = st.get("chunk_hits", 0) + st.get("chunk_misses", 0) > 0
    return {"item_tokens": items, "item_miss_tokens": max(0, items - reused) if looked_up else 0,
            "history_tokens": int((st.get("tokens_by_kind") or {}).get("history", 0))}


async def _run(url: str, bodies: list[dict], arrivals_s: Sequence[float], timeout_s: float,
               on_answer: Callable[[dict], None] | None) -> list[dict]:
    """Request k leaves at t0 + arrivals_s[k]; tasks are created at their arrival time, so a
    long run holds only the requests in flight. `on_answer(row)` is called as each one ends
    (on the event loop: it must not block)."""
    async def one(client, body, sent_s):
        row = await _one(client, body)
        row["sent_s"] = sent_s
        if on_answer is not None:
            on_answer(row)
        return row

    async with httpx.AsyncClient(base_url=url, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=256,
                                                     keepalive_expiry=KEEPALIVE_EXPIRY_S)
                                 ) as client:
        t0 = time.perf_counter()
        tasks = []
        for at, body in zip(arrivals_s, bodies):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(client, body, time.perf_counter() - t0)))
        return list(await asyncio.gather(*tasks))


def run_load(url: str, bodies: list[dict], qps: float, timeout_s: float = 120.0,
             arrivals_s: Sequence[float] | None = None,
             on_answer: Callable[[dict], None] | None = None, keep_rows: bool = False) -> dict:
    """Sends `bodies` at `qps` (request k at k / qps), or at `arrivals_s` (seconds from the
    start, ascending) when given, and summarises: throughput, latency and TTFT percentiles.
    `keep_rows`: the per-request rows under "requests" too."""
    if arrivals_s is None:
        arrivals_s = [k / qps for k in range(len(bodies))]
    if len(arrivals_s) != len(bodies):
        raise ValueError("one arrival time per body")
    t0 = time.perf_counter()
    rows = asyncio.run(_run(url, bodies, arrivals_s, timeout_s, on_answer))
    wall_s = time.perf_counter() - t0
    out = summarise(rows, wall_s)
    if keep_rows:
        out["requests"] = rows
    return out


def summarise(rows: list[dict], wall_s: float) -> dict:
    """Counts and percentiles of a load's per-request rows."""
    ok = [r for r in rows if r["status"] == 200]
    lat = np.array([r["latency_ms"] for r in ok]) if ok else np.zeros(1)
    ttft = np.array([r["ttft_ms"] for r in ok]) if ok else np.zeros(1)
    per_instance: dict[int, int] = {}
    for r in ok:
        per_instance[r["instance"]] = per_instance.get(r["instance"], 0) + 1
    statuses: dict[int, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"sent": len(rows), "ok": len(ok), "statuses": dict(sorted(statuses.items())),
            "rejected_429": sum(r["status"] == 429 for r in rows),
            "failed": sum(r["status"] not in (200, 429) for r in rows),
            "wall_s": wall_s, "throughput_rps": len(ok) / wall_s,
            "latency_p50_ms": float(np.percentile(lat, 50)),
            "latency_p99_ms": float(np.percentile(lat, 99)),
            "ttft_p50_ms": float(np.percentile(ttft, 50)),
            "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "http_over_engine_ttft_p50": float(np.percentile(lat, 50) / np.percentile(ttft, 50))
            if ok else 0.0,
            "total_p50_ms": float(np.percentile([r["total_ms"] for r in ok], 50)) if ok else 0.0,
            "chunk_hit_ratio": sum(r["hits"] for r in ok) / max(1, sum(r["lookups"] for r in ok)),
            "fetched_items": sum(r["fetched"] for r in ok),
            "recomputed_fraction": float(np.mean([r["recomputed_fraction"] for r in ok]))
            if ok else 0.0,
            "per_instance": dict(sorted(per_instance.items()))}
