"""Validation during training: the evaluation's cases for validation users, scored per path.

The cases are `rcllm eval`'s (`eval.protocol.build_cases`: each user's last item among
`candidates` − 1 popularity negatives, seeded per user), kept to the validation users of the
run's split, so the validation NDCG@10 the trainer reports is the number `rcllm eval --users validation`
reports for those users; the checkpoint is chosen by their cross-entropy. Test users are never read here.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..eval.metrics import ndcg
from ..eval.protocol import EvalCase, build_cases
from ..records import Dataset, UserId

EVAL_HISTORY_WINDOW = 10  # what `rcllm eval` builds its cases with (the prompt cuts further)


def validation_cases(ds: Dataset, users: Sequence[UserId], candidates: int, limit: int
                     ) -> list[EvalCase]:
    """At most `limit` evaluation cases of `users` (in the evaluation's user order)."""
    if limit <= 0 or not users:
        return []
    keep = set(users)
    cases = build_cases(ds, history_window=EVAL_HISTORY_WINDOW, num_negatives=candidates - 1)
    return [c for c in cases if c.user_id in keep][:limit]


@torch.no_grad()
def validate(score: Callable[[EvalCase], dict[str, torch.Tensor]], cases: Sequence[EvalCase],
             progress: bool = False) -> dict[str, float]:
    """Mean NDCG@10, top-1 hit rate and target cross-entropy per path over `cases`
    (`score(case)` → {path: scores [C]}), keys like "ndcg10_full", "ce_reuse"; "score" is
    minus the mean cross-entropy over the paths (what the best checkpoint is chosen by: a
    mean over every candidate's probability, which the few dozen validation users resolve
    where their NDCG@10, a rank of one item per user, is noise). "score_se": the standard
    error of that mean over the cases (each case's cross-entropy averaged over the paths;
    `learnt` compares the kept checkpoint's with chance), "cases" their count."""
    from tqdm import tqdm

    sums: dict[str, float] = {}
    per_case: list[float] = []   # each case's cross-entropy, the mean over the paths
    for case in tqdm(cases, desc="validation", unit="user", disable=not progress, leave=False):
        target = case.target_index
        ces = []
        for path, s in score(case).items():
            s = s.float().cpu()  # scores may live on the model's device (cuda)
            ce = float(F.cross_entropy(s.unsqueeze(0), torch.tensor([target])))
            ces.append(ce)
            vals = {"ndcg10": ndcg(s.numpy(), target, 10), "ce": ce,
                    "top1": float(int(s.argmax()) == target)}
            for name, v in vals.items():
                sums[f"{name}_{path}"] = sums.get(f"{name}_{path}", 0.0) + v
        per_case.append(sum(ces) / len(ces))
    out = {k: v / len(cases) for k, v in sums.items()}
    ce = [v for k, v in out.items() if k.startswith("ce_")]
    out["score"] = -sum(ce) / len(ce) if ce else -math.inf
    out["score_se"] = _standard_error(per_case)
    out["cases"] = len(per_case)
    return out


def _standard_error(values: Sequence[float]) -> float | None:
    """The standard error of the mean of `values` (sample deviation / sqrt n); None below 2."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
