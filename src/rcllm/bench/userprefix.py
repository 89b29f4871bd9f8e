"""`rcllm bench userprefix`: one batched pass over a cached user prefix vs independent forwards.

One run on the real model: the user side (~`prefix_tokens` tokens) is computed once; for each
C the C candidates are scored in one batched pass; `independent` of them are also scored by
full forwards (prefix + suffix, no cache). The independent cost of C candidates is C × the
measured mean forward time — an extrapolation from `independent` forwards, reported as such
(`independent_extrapolated`). Scores are compared on the candidates measured both ways.
Also measured: the drift of an incremental append (last `append_entries` entries appended to
the cached prefix of the shorter history — the first slots of the full prefix, exact under the
causal mask) vs the fresh compute, and the INT8 cache option.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from ..report import markdown_table
from ..userprefix.append import append_prefix, kv_drift
from ..userprefix.kv import PrefixKV, StoredKV
from ..userprefix.scoring import compute_prefix, score_batched, score_independent
from .userprefix_workload import long_history, pointwise_prompt, sample_candidates, synthetic_dataset

COLUMNS = ("candidates", "suffix_tokens", "batched_ms", "independent_ms_per_forward",
           "independent_ms", "speedup", "speedup_cold", "max_abs_diff")


def _timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[Any, float]:
    """(the last result, the median wall time in ms over `repeats` calls)."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return out, statistics.median(times)


def _append_drift(model, prompt, user, history, kv: PrefixKV, entries: int):
    """The last `entries` history entries appended to the user side of the rest: its drift
    from the prefix computed whole, and the append's time."""
    # causal attention: the first N' slots of the full prefix *are* the shorter history's KV
    old_tokens = len(prompt.user_side(user, history[:-entries]).ids)
    base = PrefixKV(kv.k[:, :, :old_tokens], kv.v[:, :, :old_tokens])
    appended, append_ms = _timed(lambda: append_prefix(model, base, prompt.history_ids(
        history[-entries:])))
    return kv_drift(appended, kv), append_ms


def run_bench(loaded, counts: list[int], prefix_tokens: int, independent: int, repeats: int,
              append_entries: int, seed: int) -> tuple[list[dict], dict]:
    model = loaded.model
    dataset = synthetic_dataset(seed=seed)
    prompt = pointwise_prompt(loaded, dataset, max_prefix_tokens=model.arch.max_positions)
    user = max(sorted(dataset.users), key=lambda u: len(dataset.users[u]))
    history = long_history(prompt, dataset.users[user], prefix_tokens)
    side = prompt.user_side(user, history)
    cands = sample_candidates(dataset, max(counts), seed)
    suffixes = [prompt.candidate_ids(c) for c in cands]
    yes, no = prompt.yes_id, prompt.no_id

    score_batched(model, compute_prefix(model, side.ids[:64]), suffixes[:4], yes, no)  # warm-up
    kv, prefix_ms = _timed(lambda: compute_prefix(model, side.ids))
    measured = min(independent, len(suffixes))
    ref, ref_ms = [], []
    for s in suffixes[:measured]:
        p, ms = _timed(lambda s=s: score_independent(model, side.ids, s, yes, no))
        ref.append(p)
        ref_ms.append(ms)
    per_forward_ms = statistics.mean(ref_ms)
    rows, by_c = [], {}
    for c in counts:
        probs, ms = _timed(lambda c=c: score_batched(model, kv, suffixes[:c], yes, no), repeats)
        by_c[c] = probs
        k = min(c, measured)
        diff = max(abs(float(probs[i]) - ref[i]) for i in range(k))
        rows.append({"candidates": c, "suffix_tokens": sum(len(s) for s in suffixes[:c]),
                     "batched_ms": ms, "independent_ms_per_forward": per_forward_ms,
                     "independent_ms": c * per_forward_ms, "speedup": c * per_forward_ms / ms,
                     "speedup_cold": c * per_forward_ms / (ms + prefix_ms),
                     "max_abs_diff": diff, "compared": k})
        print(f"C={c}: batched {ms:.0f} ms, {c} independent ≈ {c * per_forward_ms:.0f} ms "
              f"(×{c * per_forward_ms / ms:.1f}), max |Δscore| {diff:.2e}", flush=True)

    drift, append_ms = _append_drift(model, prompt, user, history, kv, append_entries)
    stored = StoredKV.of(kv, int8=True)
    c8 = min(counts)
    q8 = score_batched(model, stored.load(model.dtype, model.device), suffixes[:c8], yes, no)
    f32 = by_c[c8]
    summary = {"prefix_tokens": len(side.ids), "prefix_ms": prefix_ms,
               "independent_measured": measured, "independent_extrapolated": True,
               "speedup_at_max_c": rows[-1]["speedup"],
               "max_abs_diff": max(r["max_abs_diff"] for r in rows),
               "append_entries": append_entries, "append_ms": append_ms,
               "append_drift_k_max_abs": drift["k_max_abs"],
               "append_drift_v_max_abs": drift["v_max_abs"],
               "append_drift_k_rel": drift["k_rel"], "append_drift_v_rel": drift["v_rel"],
               "prefix_bytes_float": kv.nbytes, "prefix_bytes_int8": stored.nbytes,
               "int8_max_abs_score_diff": float((q8 - f32).abs().max()),
               "int8_compared": c8, "threads": torch.get_num_threads()}
    print(markdown_table(rows, COLUMNS))
    print(f"prefix {len(side.ids)} tokens in {prefix_ms:.0f} ms; append of {append_entries} "
          f"entries {append_ms:.0f} ms, drift K {drift['k_max_abs']:.1e} "
          f"V {drift['v_max_abs']:.1e}; INT8 {stored.nbytes / kv.nbytes:.2f} of the float bytes")
    return rows, summary
