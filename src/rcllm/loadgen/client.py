"""An open-loop load generator over HTTP: requests at a fixed rate, bounded in count and time.

Open loop (arrivals do not wait for answers), so queueing and 429s show up as they would
with independent clients. Every request is accounted for: answered (200), refused (429),
refused for bad input (4xx) or failed (5xx / transport error). With a relay in front
(`relay_lead_s`) each ranking's /v1/prewarm leaves that long before it, one per ranking, under
the same timeout; a ranking never waits for its prewarm, and a prewarm's failure is counted on
its own row, never a ranking's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

import httpx
import numpy as np

from ..serve.server import KEEP_ALIVE_S
from .series import check_relay_lead

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
                   # what was served: the top ten, scored against the trace's reviewed item
                   top10=[str(i) for i in (js.get("ranking") or [])[:10]],
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


async def _prewarm(client: httpx.AsyncClient, body: dict) -> dict[str, Any]:
    """/v1/prewarm of a rank body's user part, as a relay sends it at the retrieval stage."""
    sent = time.perf_counter()
    try:
        r = await client.post("/v1/prewarm", json={"user_id": body["user_id"],
                                                   "history": body.get("history", [])})
    except httpx.HTTPError as exc:
        return {"status": -1, "error": type(exc).__name__, "user": body.get("user_id")}
    out = {"status": r.status_code, "latency_ms": (time.perf_counter() - sent) * 1e3,
           "user": body.get("user_id")}
    if r.status_code == 200:
        js = r.json()
        out.update(instance=js["instance"], computed=js["computed"], tokens=js["tokens"],
                   engine_ms=js.get("engine_ms", 0.0), lock_wait_ms=js.get("lock_wait_ms", 0.0))
    return out


def schedule(arrivals_s: Sequence[float], lead_s: float | None) -> list[tuple[float, int, int]]:
    """The client's sends in time order, (seconds from the first ranking's arrival, kind, k):
    kind 1 is request k's ranking at arrivals_s[k]; with `lead_s`, kind 0 is its prewarm
    `lead_s` earlier (a prewarm first where two fall at one time)."""
    events = [(float(a), 1, k) for k, a in enumerate(arrivals_s)]
    if lead_s is not None:
        events += [(float(a) - lead_s, 0, k) for k, a in enumerate(arrivals_s)]
    return sorted(events)


async def _run(url: str, bodies: list[dict], arrivals_s: Sequence[float], timeout_s: float,
               on_answer: Callable[[dict], None] | None, lead_s: float | None = None
               ) -> tuple[list[dict], list[dict], float]:
    """Request k leaves at t0 + arrivals_s[k] (with `lead_s`, its prewarm `lead_s` before;
    the ranking never waits for it); tasks are created at their send time, so a long run holds
    only the requests in flight. `on_answer(row)` is called as each ranking ends (on the event
    loop: it must not block). (ranking rows, prewarm rows, seconds from t0 to the last answer)."""
    async def one(client, call, body, t0):
        sent_s = time.perf_counter() - t0
        row = await call(client, body)
        row.update(sent_s=sent_s, answered_s=time.perf_counter() - t0)
        if on_answer is not None and call is _one:
            on_answer(row)
        return row

    async with httpx.AsyncClient(base_url=url, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=256,
                                                     keepalive_expiry=KEEPALIVE_EXPIRY_S)
                                 ) as client:
        t0 = time.perf_counter() + (lead_s or 0.0)
        tasks: list[dict[int, asyncio.Task]] = [{}, {}]     # prewarms, rankings by request
        for at, kind, k in schedule(arrivals_s, lead_s):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks[kind][k] = asyncio.create_task(one(client, _one if kind else _prewarm,
                                                     bodies[k], t0))
        pre, ranked = [list(await asyncio.gather(*[ts[k] for k in sorted(ts)]))
                       for ts in tasks]
        return ranked, pre, time.perf_counter() - t0


def run_load(url: str, bodies: list[dict], qps: float, timeout_s: float = 120.0,
             arrivals_s: Sequence[float] | None = None,
             on_answer: Callable[[dict], None] | None = None, keep_rows: bool = False,
             relay_lead_s: float | None = None) -> dict:
    """Sends `bodies` at `qps` (request k at k / qps), or at `arrivals_s` (seconds from the
    start, ascending) when given, and summarises: throughput, latency and TTFT percentiles.
    `keep_rows`: the per-request rows under "requests" too. `relay_lead_s`: a relay in front
    (`check_relay_lead`): each request's /v1/prewarm sent that long before its ranking, its
    rows under "prewarms" and each ranking row linked to its prewarm (`link_prewarms`); the
    wall time runs from the first ranking's send, as without it."""
    if arrivals_s is None:
        arrivals_s = [k / qps for k in range(len(bodies))]
    if len(arrivals_s) != len(bodies):
        raise ValueError("one arrival time per body")
    if relay_lead_s is not None:
        check_relay_lead(relay_lead_s)
    rows, pre, wall_s = asyncio.run(_run(url, bodies, arrivals_s, timeout_s, on_answer,
                                         relay_lead_s))
    out = summarise(rows, wall_s)
    if relay_lead_s is not None:
        link_prewarms(rows, pre)
        out["prewarms"] = pre
    if keep_rows:
        out["requests"] = rows
    return out


def link_prewarms(rows: list[dict], prewarms: list[dict]) -> None:
    """Each ranking row (request order) gets its prewarm's status, instance (None unless
    answered) and `prewarm_ready`: answered before the ranking was sent."""
    for r, p in zip(rows, prewarms, strict=True):
        r["prewarm_status"] = p["status"]
        r["prewarm_instance"] = p.get("instance")
        r["prewarm_ready"] = p["status"] == 200 and p["answered_s"] <= r["sent_s"]


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
