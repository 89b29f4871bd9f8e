"""The pointwise (TALLRec-style) prompt: the user side, then one block per candidate.

    user side  = [instruction] ([bullet][history chunk])*
    block      = "\n\nWill I like" [item chunk] "? Answer:"      → next token " Yes" or " No"
                 (`prompt.block_ending=mark`: the tail is "?" alone)

The head of every block is the same text at the same position after the same user side, so
its KV is the same in every block: the prompt holds it once, at the end of the shared part,
and a block is the item chunk and the tail (3 tokens of fixed text per candidate, 1 with
`prompt.block_ending=mark`).

History chunks use `PromptBuilder.history_chunk` and item chunks `PromptBuilder.item_chunk`
(the same text and token limits as the listwise prompt). Each piece is tokenised on its own and
the ids concatenated, so the user side of a longer history is the user side of the shorter one
plus the new chunks (an incremental append equals a fresh compute), and an item chunk's ids are
the same in every block. All blocks start right after the user side and see it and themselves
only (`prefill.layout.Layout`), so an item chunk's KV can come from the chunk store — built
after the instruction and the block head, its template context — like in the listwise prompt.
The fixed text of a block (head + tail) is computed for every candidate of every request, so it
is kept to a few tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from ..config import BLOCK_ENDINGS
from ..errors import RcllmError
from ..records import HistoryEntry, ItemId, UserId
from .builder import Prompt, PromptBuilder, Segment

INSTRUCTION = (
    "<|im_start|>system\nYou are a recommender system. You read a user's past reviews and "
    "answer whether the user will like an item, with Yes or No.<|im_end|>\n"
    "<|im_start|>user\nMy past reviews, oldest first:")
BLOCK_HEAD = "\n\nWill I like"
YES, NO = " Yes", " No"


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
        self._head = self._encode(BLOCK_HEAD)
        self._tail = self._encode(BLOCK_ENDINGS[builder.cfg.block_ending])
        self.yes_id = self._single(YES)
        self.no_id = self._single(NO)

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.builder.tok(text, add_special_tokens=False)["input_ids"])

    def _single(self, text: str) -> int:
        ids = self._encode(text)
        if len(ids) != 1:
            raise RcllmError(f"{text!r} is not a single token for this tokenizer")
        return ids[0]

    def context_ids(self, kind: str) -> tuple[int, ...]:
        """The dynamic text right before a chunk of `kind` (its KV is built after the
        instruction and this): the block head for items, the bullet for history entries."""
        return self._head if kind == "item" else self.builder.context_ids("history")

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

    def prompt(self, req) -> "Prompt":
        """The engine's pointwise prompt of a RankRequest: the shared part — the user side
        (instruction, then bullet + history chunk of each of the last `history_window`
        entries) and the block head — and one block per candidate (item chunk, tail). Token for
        token, shared part + block is `user_side(...).ids + candidate_ids(c)`. RcllmError for
        bad input."""
        self.builder.validate(req)
        history, dropped = self.builder.history_segments(req.history)
        # every block would start with the same head at the same position, seeing the same
        # user side: its KV is the same in every block, so it is computed once, at the end of
        # the shared part (the scores are those of per-block heads; a test pins them)
        segs = [Segment("instruction", self._instruction), *history,
                Segment("question", self._head)]
        blocks = [[Segment("item", self.builder.item_chunk(c), c),
                   Segment("question", self._tail)] for c in req.candidates]
        out = Prompt(segs, tuple(req.candidates), (), dropped, blocks)
        total = len(out) + max(sum(len(s.token_ids) for s in b) for b in blocks)
        if total > self.max_prefix_tokens:
            raise RcllmError(f"the pointwise prompt has {total} tokens, over the limit of "
                             f"{self.max_prefix_tokens}; lower prompt.history_window or "
                             "prompt.max_review_tokens")
        return out

    build = prompt  # the name PromptBuilder uses: both are a scorer's prompt source

    @property
    def instruction_ids(self) -> tuple[int, ...]:
        return self._instruction

    @property
    def head_ids(self) -> tuple[int, ...]:
        """The block head, the last segment of the shared part (not part of a user side)."""
        return self._head

    def candidate_ids(self, item_id: ItemId) -> tuple[int, ...]:
        """One candidate's block: head + item chunk + tail; RcllmError for an unknown item."""
        if item_id not in self.builder.catalog:
            raise RcllmError(f"unknown candidate item id {item_id!r}")
        return self._head + self.builder.item_chunk(item_id) + self._tail
