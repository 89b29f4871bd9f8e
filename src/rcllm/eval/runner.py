"""Quality and fidelity of every method on the same requests (`rcllm eval`).

Per request: `full` gives the reference scores, full-vocabulary distribution and last hidden
state; each method variant is compared with it. Two references show whether the metrics can
discriminate at all: `full_reordered` (full on a seeded re-ordering of the same candidates,
scores mapped back to the items: position bias) and `full_content_swapped` (full with the
candidate texts permuted among the label positions, scores read per position: content
sensitivity). With `user_swapped`, every path is also run with another evaluated user's history
(`<variant>_user_swapped`, `full_user_swapped`): the drop of a path's NDCG@10 under the swap
(paired over the requests) says how much its ranking reads the user rather than item priors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from ..prompt.builder import RankRequest
from . import metrics as M

KS = (1, 5, 10)
FIDELITY_KEYS = ("top1_agreement", "top5_overlap", "kendall_tau", "kl_vs_full",
                 "hidden_cosine_vs_full")
FULL_FIDELITY = {"top1_agreement": 1.0, "top5_overlap": 1.0, "kendall_tau": 1.0,
                 "kl_vs_full": 0.0, "hidden_cosine_vs_full": 1.0}


@dataclass
class _Acc:
    rank: list = field(default_factory=list)      # per-request ranking metric dicts
    fid: list = field(default_factory=list)       # per-request fidelity dicts
    ttft: list = field(default_factory=list)
    frac: list = field(default_factory=list)


def _vec(result, order) -> np.ndarray:
    return np.array([result.scores[c] for c in order])


def _ranking_fidelity(ref_scores, scores) -> dict:
    return {"top1_agreement": float(M.top1_agreement(ref_scores, scores)),
            "top5_overlap": M.topk_overlap(ref_scores, scores, 5),
            "kendall_tau": M.kendall_tau(ref_scores, scores)}


def _per_item(result, t: torch.Tensor) -> torch.Tensor:
    """Rows of a per-candidate tensor (pointwise scorer: one row per candidate in prompt order)
    put in item-id order, so two runs with different candidate orders compare item by item."""
    if t.dim() < 2:
        return t
    order = list(result.scores)  # prompt order
    return t[[order.index(c) for c in sorted(order)]]


def _fidelity(ref, res, ref_scores, scores) -> dict:
    """KL of the next-token distribution and cosine of the final hidden state against full;
    with the pointwise scorer the KL is that of each candidate's yes/no distribution, averaged
    over the candidates, and the cosine is taken over all candidates' hidden states."""
    kl = float(np.mean(M.kl_from_logits(_per_item(ref, ref.logits).double().cpu().numpy(),
                                        _per_item(res, res.logits).double().cpu().numpy())))
    cos = float(torch.nn.functional.cosine_similarity(
        _per_item(ref, ref.hidden).flatten(), _per_item(res, res.hidden).flatten(), dim=0))
    return {**_ranking_fidelity(ref_scores, scores), "kl_vs_full": kl,
            "hidden_cosine_vs_full": cos}


def _rank_avg(engine, case, orders, method: str, **overrides):
    """Ranks the case under every candidate order; returns (first result, scores averaged per
    item in case order). With one order this is a plain ranking."""
    cands = list(case.candidates)
    first, total = None, np.zeros(len(cands))
    for order in orders:
        res = engine.rank(RankRequest(case.user_id, case.history, tuple(order)), method,
                          keep_tensors=True, prefix_insert=False, **overrides)
        first = res if first is None else first
        total += _vec(res, cands)
    return first, total / len(orders)


def swap_partner(cases, i: int) -> int:
    """The case whose history replaces case i's in the user-swapped reference: the next case
    (cyclically) of another user, so every history is used once when users are distinct."""
    n = len(cases)
    for step in range(1, n):
        j = (i + step) % n
        if cases[j].user_id != cases[i].user_id:
            return j
    raise ValueError("the user-swapped reference needs cases of at least two users")


def evaluate(engine, cases, variants, seed: int = 0, progress: bool = False,
             permutations: int = 1, user_swapped: bool = False) -> list[dict]:
    """One row per variant and reference. permutations > 1 averages each item's score over
    that many label orders (the first is the case's own order), as Hou et al. do, so that
    content rather than label position drives the ranking. user_swapped adds, per path, the
    row of the same requests scored with another user's history (`swap_partner`)."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    acc: dict[str, _Acc] = {}
    labels = ["full", "full_reordered", "full_content_swapped"] + [
        v.label for v in variants if v.method != "full"]
    if user_swapped:
        labels += [f"{lab}_user_swapped" for lab in labels if lab not in
                   ("full_reordered", "full_content_swapped")]
    for lab in labels:
        acc[lab] = _Acc()
    for i, case in enumerate(tqdm(cases, desc="evaluating", unit="req", disable=not progress)):
        cands = list(case.candidates)
        target = cands.index(case.target)

        def shuffled() -> tuple:
            return tuple(cands[i] for i in rng.permutation(len(cands)))

        orders = [tuple(cands)] + [shuffled() for _ in range(permutations - 1)]
        other_orders = [shuffled() for _ in range(permutations)]
        full, full_s = _rank_avg(engine, case, orders, "full")
        _record(acc["full"], full, full_s, target, None)
        reo, reo_s = _rank_avg(engine, case, other_orders, "full")  # same items, other labels
        reo_fid = _fidelity(full, reo, full_s, reo_s)
        _record(acc["full_reordered"], reo, reo_s, target, reo_fid)
        # position j shows the text of other_orders[0][j]; its score stays with candidate j.
        # Same forward pass, so the distribution metrics (KL, cosine) are the reordered ones.
        swp_s = np.array([reo.scores[other_orders[0][j]] for j in range(len(cands))])
        swp_fid = {**reo_fid, **_ranking_fidelity(full_s, swp_s)}
        _record(acc["full_content_swapped"], reo, swp_s, target, swp_fid)
        for v in variants:
            if v.method == "full":
                continue
            res, s = _rank_avg(engine, case, orders, v.method, **v.overrides())
            _record(acc[v.label], res, s, target, _fidelity(full, res, full_s, s))
        if user_swapped:
            other = cases[swap_partner(cases, i)]
            swapped = dataclasses.replace(case, user_id=other.user_id, history=other.history)
            for v in [None] + [v for v in variants if v.method != "full"]:
                method, over = ("full", {}) if v is None else (v.method, v.overrides())
                res, s = _rank_avg(engine, swapped, orders, method, **over)
                _record(acc[f"{'full' if v is None else v.label}_user_swapped"], res, s,
                        target, _fidelity(full, res, full_s, s))
    return _rows(acc, variants, engine.scorer, len(cases))


def _record(a: _Acc, res, scores, target, fid) -> None:
    a.rank.append(M.ranking_metrics(scores, target, KS))
    if fid is not None:
        a.fid.append(fid)
    a.ttft.append(res.ttft_ms)
    a.frac.append(res.stats["recomputed_fraction"])


def _rows(acc: dict[str, _Acc], variants, scorer: str, n: int) -> list[dict]:
    by_label = {v.label: v for v in variants}
    full_ndcg = np.array([r["ndcg@10"] for r in acc["full"].rank])
    rows = []
    for lab, a in acc.items():
        v = by_label.get(lab)
        row = {"method": lab if v is None else v.method, "variant": lab,
               "item_ratio": v.item_ratio if v and v.method in ("rcllm", "cacheblend") else None,
               "history_ratio": v.history_ratio if v and v.method == "rcllm" else None,
               "requests": n, "scorer": scorer}
        for key in a.rank[0]:
            row[key] = float(np.mean([r[key] for r in a.rank]))
        for key in ("hr@10", "ndcg@10"):
            ci = M.bootstrap_ci([r[key] for r in a.rank])
            row[f"{key}_ci_low"], row[f"{key}_ci_high"] = ci.low, ci.high
        delta = M.paired_bootstrap_ci(np.array([r["ndcg@10"] for r in a.rank]), full_ndcg)
        row["ndcg@10_delta_vs_full"] = delta.mean
        row["ndcg@10_delta_vs_full_ci_low"] = delta.low
        row["ndcg@10_delta_vs_full_ci_high"] = delta.high
        if lab.endswith("_user_swapped"):  # the path's drop when another user's history is read
            own = np.array([r["ndcg@10"] for r in acc[lab[:-len("_user_swapped")]].rank])
            drop = M.paired_bootstrap_ci(own, np.array([r["ndcg@10"] for r in a.rank]))
            row["user_swap_drop"] = drop.mean
            row["user_swap_drop_ci_low"], row["user_swap_drop_ci_high"] = drop.low, drop.high
        for key in FIDELITY_KEYS:
            vals = [f[key] for f in a.fid if not np.isnan(f[key])]
            row[key] = float(np.mean(vals)) if vals else None
        if lab == "full":  # the reference against itself, by definition
            row.update(FULL_FIDELITY)
        row["ttft_p50_ms"] = float(np.median(a.ttft))
        row["ttft_ms_all"] = [float(t) for t in a.ttft]
        row["recomputed_fraction"] = float(np.mean(a.frac))
        rows.append(row)
    return rows
