"""The " Yes" − " No" score is written once (`prefill.scoring.yes_no_score`): the engine's
scorer, the user-prefix library and the trainer's paths call it, so training and serving
cannot drift apart through a copy."""

from __future__ import annotations

import pathlib
import re

import torch

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "rcllm"


def test_yes_no_logits_read_only_by_the_one_score():
    users = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
             if re.search(r"\byes_no_logits\(", p.read_text()) and p.name != "scoring.py"]
    assert users == []
    callers = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
               if "yes_no_score(" in p.read_text()}
    assert {"engine/scorers.py", "finetune/paths.py", "userprefix/scoring.py"} <= callers


def test_yes_no_score_is_the_log_odds_of_the_two_rows():
    from rcllm.prefill.scoring import yes_no_score

    class M:
        lm_head = torch.randn(10, 4)

    h = torch.randn(3, 4)
    score, logits = yes_no_score(M, h, 7, 2)
    full = h @ M.lm_head.T
    assert torch.allclose(score, full[:, 7] - full[:, 2], atol=1e-5)
    assert torch.allclose(torch.sigmoid(score), torch.softmax(logits, -1)[:, 0], atol=1e-6)
