"""Tier benchmark: get/put latency and throughput per tier vs a raw memory copy, in one run.

Every figure is measured in the same process on the same entries, so ratios (tier GB/s over
memcpy GB/s, recompute time over fetch time) are comparable even when absolute numbers move
between machines. Disk reads are usually served from the OS page cache right after the writes;
the numbers are then a lower bound on latency for a cold disk.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..kvstore.base import ChunkKey, ChunkKV, KVStore, MemoryLRUStore, chunk_key
from ..kvstore.codec import KeyCheck
from ..kvstore.disk import DiskStore
from ..kvstore.int8 import int8_fidelity

FINGERPRINT = "rcllm-bench-kvstore"


@dataclass(frozen=True)
class BenchConfig:
    """Entry shape (default: SmolLM2-135M, 128-token chunk, fp32 = 5.9 MB) and run size."""

    layers: int = 30
    kv_heads: int = 3
    head_dim: int = 64
    tokens: int = 128
    entries: int = 16
    recompute_ms_per_token: float | None = None  # from `rcllm bench ttft` (the engine)
    seed: int = 0


def make_entries(cfg: BenchConfig) -> list[tuple[ChunkKey, ChunkKV]]:
    g = torch.Generator().manual_seed(cfg.seed)
    shape = (cfg.layers, cfg.kv_heads, cfg.tokens, cfg.head_dim)
    out = []
    for i in range(cfg.entries):
        ids = tuple(range(i * cfg.tokens, (i + 1) * cfg.tokens))
        out.append((chunk_key(FINGERPRINT, "item", ids),
                    ChunkKV(ids, torch.randn(shape, generator=g), torch.randn(shape, generator=g))))
    return out


def _time_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


def _row(tier: str, op: str, times_ms: list[float], entry_bytes: int, stored_bytes: int,
         memcpy_gb_s: float, recompute_ms: float | None) -> dict:
    p50 = statistics.median(times_ms)
    gb_s = entry_bytes / (p50 / 1000.0) / 1e9 if p50 > 0 else float("inf")
    return {"tier": tier, "op": op, "latency_ms_p50": p50,
            "latency_ms_max": max(times_ms), "throughput_gb_s": gb_s,
            "vs_memcpy": gb_s / memcpy_gb_s, "entry_bytes": entry_bytes,
            "stored_bytes": stored_bytes,
            "recompute_ms": recompute_ms,
            "recompute_over_fetch": (recompute_ms / p50 if recompute_ms is not None and op == "get"
                                     and p50 > 0 else None)}


def bench_memcpy(entries: list[tuple[ChunkKey, ChunkKV]]) -> list[float]:
    """Times of copying each entry's K and V into preallocated, already-touched buffers: the
    memory bandwidth bound, without allocation or page-fault costs."""
    dst_k, dst_v = torch.empty_like(entries[0][1].k), torch.empty_like(entries[0][1].v)
    dst_k.copy_(entries[0][1].k)
    dst_v.copy_(entries[0][1].v)
    return [_time_ms(lambda kv=kv: (dst_k.copy_(kv.k), dst_v.copy_(kv.v))) for _, kv in entries]


def bench_tier(name: str, store: KVStore, entries: list[tuple[ChunkKey, ChunkKV]],
               memcpy_gb_s: float, recompute_ms: float | None) -> list[dict]:
    """put then get every entry; checks each get returns the entry (a miss is an error)."""
    put_ms = [_time_ms(lambda k=k, kv=kv: store.put(k, kv)) for k, kv in entries]
    stored = store.nbytes // max(1, len(store))
    got: list[ChunkKV | None] = []
    get_ms = [_time_ms(lambda k=k: got.append(store.get(k))) for k, _ in entries]
    if any(g is None for g in got):
        raise RuntimeError(f"{name}: a stored entry was missed; the benchmark is invalid")
    store.check_invariants()
    size = entries[0][1].nbytes
    return [_row(name, "put", put_ms, size, stored, memcpy_gb_s, recompute_ms),
            _row(name, "get", get_ms, size, stored, memcpy_gb_s, recompute_ms)]


def run(cfg: BenchConfig, redis_port: int | None = None) -> tuple[list[dict], dict]:
    """All tiers; Redis only when `redis_port` is given. Returns (rows, summary).

    Runs with one torch thread: a copy of a few MB is faster on one core than split across
    cores that other processes are using (on a shared 2-core box, 2 threads were ~200× slower
    for memcpy), and the tiers' own I/O is single-threaded anyway."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(cfg, redis_port)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: BenchConfig, redis_port: int | None) -> tuple[list[dict], dict]:
    entries = make_entries(cfg)
    size = entries[0][1].nbytes
    memcpy_ms = bench_memcpy(entries)
    memcpy_gb_s = size / (statistics.median(memcpy_ms) / 1000.0) / 1e9
    recompute_ms = (cfg.recompute_ms_per_token * cfg.tokens
                    if cfg.recompute_ms_per_token is not None else None)
    rows = [_row("memcpy", "copy", memcpy_ms, size, size, memcpy_gb_s, recompute_ms)]
    check = KeyCheck(FINGERPRINT)
    rows += bench_tier("memory", MemoryLRUStore(4 * size * cfg.entries), entries, memcpy_gb_s,
                       recompute_ms)
    with tempfile.TemporaryDirectory(prefix="rcllm-kvbench-") as tmp:
        for encoding in ("raw", "int8"):
            disk = DiskStore(f"{tmp}/{encoding}", check=check, encoding=encoding)
            rows += bench_tier(f"disk-{encoding}", disk, entries, memcpy_gb_s, recompute_ms)
    if redis_port is not None:
        from ..kvstore.redis_store import RedisStore

        for encoding in ("raw", "int8"):
            redis = RedisStore(port=redis_port, check=check, encoding=encoding,
                               socket_timeout_s=5.0, prefix=f"rcllm:bench:{encoding}:")
            rows += bench_tier(f"redis-{encoding}", redis, entries, memcpy_gb_s, recompute_ms)
            redis.close()
    fid = int8_fidelity(entries[0][1])
    summary = {"entry_bytes": size, "memcpy_gb_s": memcpy_gb_s,
               "int8_saved_fraction": fid.saved_fraction, "int8_k_max_abs_err": fid.k_max_abs_err,
               "int8_v_max_abs_err": fid.v_max_abs_err, "int8_k_rel_err": fid.k_rel_err,
               "int8_v_rel_err": fid.v_rel_err, "recompute_ms": recompute_ms,
               "redis": redis_port is not None}
    for r in rows:
        if r["op"] == "get":
            summary[f"{r['tier']}_get_ms"] = r["latency_ms_p50"]
    return rows, summary
