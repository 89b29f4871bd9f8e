"""The pointwise (TALLRec-style) prompt: user side first, then one short suffix per candidate.

    user side  = [instruction] ([bullet][history chunk])*
    candidate  = "\n\nWill I like" [title] "? Answer:"        → next token " Yes" or " No"

History chunks use `PromptBuilder.history_chunk` (the same text and token limits as the
listwise prompt). Each piece is tokenised on its own and the ids concatenated, so the user side
of a longer history is the user side of the shorter one plus the new chunks: that is what makes
an incremental append equal to a fresh compute. The candidate suffix carries the item title
only (at most `MAX_TITLE_TOKENS`), so the per-candidate work stays small next to the prefix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from ..errors import RcllmError
from ..prompt.builder import PromptBuilder
from ..records import HistoryEntry, ItemId, UserId

INSTRUCTION = (
    "<|im_start|>system\nYou are a recommender system. You read a user's past reviews and "
    "answer whether the user will like one item, with Yes or No.<|im_end|>\n"
    "<|im_start|>user\nMy past reviews, oldest first:")
QUESTION_HEAD = "\n\nWill I like"
QUESTION_TAIL = "? Answer Yes or No.<|im_end|>\n<|im_start|>assistant\nAnswer:"
YES, NO = " Yes", " No"
MAX_TITLE_TOKENS = 24


def history_hash(history: Sequence[HistoryEntry]) -> str:
    """A content hash of a history (order matters): part of the cache key."""
    h = hashlib.sha256()
    for e in history:
        h.update(f"{e.item_id}\0{e.rating!r}\0{e.timestamp}\0{e.review}\x01".encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class UserSide:
    """The token ids of one user's prefix and what they were built from."""

    user_id: UserId
    ids: tuple[int, ...]
    history_hash: str
    entries: int


class PointwisePrompt:
    """Builds user sides and candidate suffixes; raises RcllmError on bad input."""

    def __init__(self, builder: PromptBuilder, max_prefix_tokens: int):
        self.builder = builder
        self.max_prefix_tokens = max_prefix_tokens
        self._instruction = self._encode(INSTRUCTION)
        self._head = self._encode(QUESTION_HEAD)
        self._tail = self._encode(QUESTION_TAIL)
        self.yes_id = self._single(YES)
        self.no_id = self._single(NO)

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.builder.tok(text, add_special_tokens=False)["input_ids"])

    def _single(self, text: str) -> int:
        ids = self._encode(text)
        if len(ids) != 1:
            raise RcllmError(f"{text!r} is not a single token for this tokenizer")
        return ids[0]

    def history_ids(self, entries: Sequence[HistoryEntry]) -> tuple[int, ...]:
        """The ids that `entries` add to a user side (bullet + chunk each)."""
        bullet = self.builder.context_ids("history")
        out: list[int] = []
        for e in entries:
            out += bullet
            out += self.builder.history_chunk(e)
        return tuple(out)

    def user_side(self, user_id: UserId, history: Sequence[HistoryEntry]) -> UserSide:
        """The user's prefix; RcllmError when it exceeds `max_prefix_tokens`."""
        ids = self._instruction + self.history_ids(history)
        if len(ids) > self.max_prefix_tokens:
            raise RcllmError(f"user {user_id!r}: the history makes a {len(ids)}-token prefix, over "
                             f"the limit of {self.max_prefix_tokens}; shorten the history")
        return UserSide(user_id, ids, history_hash(history), len(history))

    def prompt(self, req) -> tuple["Prompt", list[tuple[int, ...]]]:
        """The engine's pointwise prompt of a RankRequest as typed segments — the user side
        (instruction, then bullet + history chunk of each of the last `history_window`
        entries) and the shared question head — and `title_ids(c)` of every candidate, the
        suffixes scored after it. Token for token, prompt + suffix is `user_side(...).ids +
        candidate_ids(c)`. RcllmError for bad input."""
        from ..prompt.builder import Prompt, Segment

        self.builder.validate(req)
        history, dropped = self.builder.history_segments(req.history)
        segs = [Segment("instruction", self._instruction), *history,
                Segment("question", self._head)]
        out = Prompt(segs, tuple(req.candidates), (), dropped)
        suffixes = [self.title_ids(c) for c in req.candidates]
        total = len(out) + max(len(s) for s in suffixes)
        if total > self.max_prefix_tokens:
            raise RcllmError(f"the pointwise prompt has {total} tokens, over the limit of "
                             f"{self.max_prefix_tokens}; lower prompt.history_window or "
                             "prompt.max_review_tokens")
        return out, suffixes

    @property
    def instruction_ids(self) -> tuple[int, ...]:
        return self._instruction

    @property
    def head_ids(self) -> tuple[int, ...]:
        """The question head every candidate suffix starts with ("\n\nWill I like")."""
        return self._head

    def candidate_ids(self, item_id: ItemId) -> tuple[int, ...]:
        """The suffix scored for one candidate; RcllmError for an unknown item."""
        return self._head + self.title_ids(item_id)

    def title_ids(self, item_id: ItemId) -> tuple[int, ...]:
        """The candidate suffix without its head: title + question tail (the engine's
        pointwise scorer keeps the shared head in the user side, so only these differ)."""
        item = self.builder.catalog.get(item_id)
        if item is None:
            raise RcllmError(f"unknown candidate item id {item_id!r}")
        title = item.title.strip() or f"item {item_id}"
        return self._encode(" " + title)[:MAX_TITLE_TOKENS] + self._tail
