"""`rcllm bench checkpoints`, model part: measured resume vs full prefill on the recurrent model.

Per workload: a random prefix of model_n tokens; each schedule's checkpoints are captured into
a store; then model_requests depths drawn from the workload are served twice — a full prefill
from the zero state, and load-deepest-checkpoint + replay — both timed in this run. Each row
also records whether the resumed state is bit-identical to the full prefill's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from .checkpoints import CheckpointBenchConfig, history_for, schedule_for
from ..checkpoints.distributions import sample_depths, workload
from ..checkpoints.model import RecurrentConfig, RecurrentLM
from ..checkpoints.resume import capture, resume
from ..checkpoints.store import CheckpointStore, PrefixId


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - start) * 1e3


def model_rows(cfg: CheckpointBenchConfig, rng: np.random.Generator) -> list[dict[str, Any]]:
    """One row per (workload, schedule, request); see docs/checkpoints.md for the keys."""
    if cfg.model_n == 0:
        return []
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    model = RecurrentLM(RecurrentConfig(seed=cfg.seed))
    n, rows = cfg.model_n, []
    schedules = [s.strip() for s in cfg.model_schedules.split(",") if s.strip()]
    gen = torch.Generator().manual_seed(cfg.seed)
    model.prefill(torch.randint(0, model.cfg.vocab, (256,), generator=gen))  # warm-up
    for name in cfg.workload_list("model_workloads"):
        tokens = torch.randint(0, model.cfg.vocab, (n,), generator=gen)
        truth = workload(name, n)
        history = history_for(truth, n, cfg, rng)
        depths = [int(d) for d in sample_depths(truth, cfg.model_requests, rng) if d > 0]
        full = {}
        for d in depths:  # the no-cache baseline, timed once per request
            full[d] = _timed(lambda d=d: model.prefill(tokens[:d]))
        for method in schedules:
            pos = schedule_for(method, n, cfg.model_budget, history, truth, cfg)
            store = CheckpointStore()
            _, capture_ms = _timed(lambda: capture(model, store, PrefixId(name), tokens, pos))
            for d in depths:
                snap = store.deepest(PrefixId(name), d)
                _, load_ms = _timed(lambda: snap.clone() if snap is not None else None)
                got, resume_ms = _timed(lambda d=d: resume(model, store, PrefixId(name), tokens, d))
                ref, full_ms = full[d]
                rows.append({
                    "part": "model", "workload": name, "schedule": method,
                    "checkpoints": len(pos), "depth": d, "resumed_from": got.resumed_from,
                    "replayed_tokens": got.replayed_tokens, "full_ms": full_ms,
                    "resume_ms": resume_ms, "load_ms": load_ms, "capture_ms": capture_ms,
                    "state_bytes": got.state.nbytes, "exact": got.state.equal(ref.state),
                })
            store.check_invariants()
    return rows


def model_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens saved vs time saved per (workload, schedule), and how well they track overall."""
    out: dict[str, Any] = {}
    if not rows:
        return out
    groups = sorted({(r["workload"], r["schedule"]) for r in rows})
    tok, tim = [], []
    for name, method in groups:
        g = [r for r in rows if r["workload"] == name and r["schedule"] == method]
        tokens_saved = 1 - sum(r["replayed_tokens"] for r in g) / sum(r["depth"] for r in g)
        time_saved = 1 - sum(r["resume_ms"] for r in g) / sum(r["full_ms"] for r in g)
        out[f"{name}.{method}.tokens_saved_frac"] = tokens_saved
        out[f"{name}.{method}.time_saved_frac"] = time_saved
        tok.append(tokens_saved)
        tim.append(time_saved)
    saved_tok = np.array([r["depth"] - r["replayed_tokens"] for r in rows], dtype=np.float64)
    saved_ms = np.array([r["full_ms"] - r["resume_ms"] for r in rows])
    out["per_request_saved_tokens_vs_ms_pearson"] = (
        float(np.corrcoef(saved_tok, saved_ms)[0, 1]) if saved_tok.std() > 0 else float("nan"))
    out["time_saved_minus_tokens_saved_max_abs"] = float(np.max(np.abs(np.array(tim) - np.array(tok))))
    full_rate = sum(r["full_ms"] for r in rows) / sum(r["depth"] for r in rows)
    out["full_prefill_ms_per_token"] = full_rate
    out["load_ms_mean"] = float(np.mean([r["load_ms"] for r in rows]))
    out["state_bytes"] = rows[0]["state_bytes"]
    out["all_exact"] = all(r["exact"] for r in rows)
    return out
