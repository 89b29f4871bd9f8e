"""Did the run learn anything? The check the end-of-run choice runs first (docs/finetune.md).

An adapter learnt nothing when the checkpoint it kept is the untrained start (early stopping
kept step 0: the validation cross-entropy never fell below the start's), or when the kept
checkpoint's validation cross-entropy is within noise of chance, ln C (C = candidates per
validation prompt): the upper end of its 95% interval — the mean over the n validation
prompts plus Student's t quantile (0.975, n − 1 degrees of freedom; 1.96 at large n) times the
standard error of that mean (`validate.validate`'s "score_se") — does not fall below ln C. A model worse than chance is caught by the same rule. The cross-entropy is the one
the checkpoint is kept by: each prompt's, averaged over the trained paths.

Such an adapter gets no fast path: the choice is skipped, and the manifest says `"learnt":
false` with the reason (`learnt_check`), so that what serves it can label its rankings as the
untuned model's.
"""

from __future__ import annotations

import math

from scipy import stats


def learnt_check(best: dict, candidates: int | None) -> dict:
    """The verdict on the kept checkpoint from its validation row (`best`: the manifest's
    "best", {"step", "score", "score_se", "cases", ...}) and the validation prompts'
    candidate count: {"learnt": True | False | None (no validation to tell), "reason", and the
    numbers it rests on}. Without "score_se" (an adapter from before it was recorded) only the
    step-0 rule can be applied, and the reason says so."""
    step = best.get("step")
    if step is None or "score" not in best:
        return {"learnt": None, "reason": "no validation users: whether it learnt is unknown"}
    if not candidates:
        return {"learnt": None, "reason": "the manifest does not record the validation "
                                          "candidates: chance is unknown"}
    ce, se, chance = -float(best["score"]), best.get("score_se"), math.log(candidates)
    out = {"best_step": step, "ce": round(ce, 4), "ln_c": round(chance, 4),
           "candidates": candidates, "se": None if se is None else round(float(se), 4),
           "cases": best.get("cases")}
    if step == 0:
        return {**out, "learnt": False,
                "reason": "the kept checkpoint is the untrained start (step 0): the validation "
                          "cross-entropy never fell below the start's"}
    if se is None:
        return {**out, "learnt": True,
                "reason": f"kept step {step}; the cross-entropy's standard error was not "
                          "recorded, so only the step-0 rule was checked"}
    upper = ce + float(stats.t.ppf(0.975, int(best["cases"]) - 1)) * float(se)
    if upper < chance:
        return {**out, "learnt": True,
                "reason": f"validation cross-entropy {ce:.3f}, 95% upper end {upper:.3f} "
                          f"(over {out['cases']} prompts), below chance ln {candidates} = "
                          f"{chance:.3f}"}
    return {**out, "learnt": False,
            "reason": f"the kept checkpoint's validation cross-entropy {ce:.3f} is within "
                      f"noise of chance ln {candidates} = {chance:.3f}: its 95% upper end "
                      f"{upper:.3f} (over {out['cases']} prompts) is not below it"}
