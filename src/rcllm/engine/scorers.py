"""Scorers: ranking strategies. Each builds the prompt of a request and turns the prefill's
output slots into one score per candidate (higher is better). They take the model, never the
engine: a scorer is the prompt → scores half of a request and nothing else."""

from __future__ import annotations

import abc

import torch

from ..model.transformer import Transformer
from ..prefill.scoring import continuation_scores, verbalizer_scores, yes_no_score
from ..prefill.selective import PrefillInputs
from ..prompt.builder import Prompt, PromptBuilder, RankRequest
from ..prompt.pointwise import PointwisePrompt

# verbalizer / likelihood: the listwise prompt; pointwise: the yes/no prompt
# (rcllm.prompt.pointwise) with every candidate scored after the one selectively prefilled user side
SCORERS = ("verbalizer", "likelihood", "pointwise")


class Scorer(abc.ABC):
    """A ranking strategy: builds the prompt of a request (through `source`, a PromptBuilder
    or a PointwisePrompt) and turns the prefill's output slots into one score per candidate
    (higher is better)."""

    name = ""
    head_rows: int | None = None  # output-head rows score() computes (None: the vocabulary)

    def __init__(self, source):
        self.source = source

    def prompt(self, req: RankRequest) -> Prompt:
        return self.source.build(req)

    def context_ids(self, kind: str) -> tuple[int, ...]:
        """Instruction + the dynamic text a chunk of `kind` is built after (its KV context)."""
        extra = () if kind == "instruction" else tuple(self.source.context_ids(kind))
        return tuple(self.source.instruction_ids) + extra

    @abc.abstractmethod
    def score(self, model: Transformer, prompt: Prompt, inp: PrefillInputs, hidden_out):
        """(scores [C], logits, normed hidden) from the output slots' hidden states."""

    def after_first_token(self, model: Transformer, prompt: Prompt, inp: PrefillInputs,
                          scores: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Work after the first token that still decides the ranking (likelihood)."""
        return scores


class ListwiseScorer(Scorer):
    """The listwise prompt; the verbalizer reads the candidate labels at the last position."""

    name = "verbalizer"

    def score(self, model, prompt, inp, hidden_out):
        logits = model.logits(hidden_out[-1])
        return verbalizer_scores(logits, prompt.label_token_ids), logits, None


class LikelihoodScorer(ListwiseScorer):
    """The listwise prompt; each candidate's name as the continuation, scored after the first
    token (its cost is in total_ms, not in the TTFT)."""

    name = "likelihood"

    def score(self, model, prompt, inp, hidden_out):
        logits = model.logits(hidden_out[-1])
        return None, logits, None

    def after_first_token(self, model, prompt, inp, scores, logits):
        conts = [self.source.continuation_ids(c) for c in prompt.candidates]
        return continuation_scores(model, inp.k_buf, inp.v_buf, logits, conts)


class PointwiseScorer(Scorer):
    """The user side, then one block per candidate (head + item chunk + tail) in one packed
    pass; score = the " Yes" − " No" logit at each block's last slot (TALLRec)."""

    name = "pointwise"
    head_rows = 2  # the " Yes" and " No" rows only

    def __init__(self, builder: PromptBuilder, max_positions: int):
        super().__init__(PointwisePrompt(builder, max_positions))
        self.pw = self.source

    def score(self, model, prompt, inp, hidden_out):
        hidden = model.final_hidden(hidden_out)
        score, logits = yes_no_score(model, hidden, self.pw.yes_id, self.pw.no_id)
        return score, logits, hidden


def make_scorer(name: str, builder: PromptBuilder, max_positions: int) -> Scorer:
    if name == "pointwise":
        return PointwiseScorer(builder, max_positions)
    return LikelihoodScorer(builder) if name == "likelihood" else ListwiseScorer(builder)
