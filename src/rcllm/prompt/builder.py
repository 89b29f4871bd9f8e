"""Prompt assembly for listwise ranking.

A prompt is a list of typed segments:

    [instruction] ([bullet][history chunk])* [items-header] ([label][item chunk])* [question]

`history` and `item` segments are *chunks*: their text depends only on the review or the
item, never on where they appear, so their token ids (and cached KV) are identical in every
prompt. A review's own date and rating are part of the review, so they live in its chunk.
Everything request-specific — candidate labels "(A)".."(T)", separators — lives in the small
`dynamic` segments between chunks. Each segment is tokenised on its own and the ids
concatenated, so a chunk's token ids never depend on its neighbours.

Reviews and item texts longer than the configured token limits are cut at the limit (the
documented truncation); a history longer than `history_window` keeps the most recent entries.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..config import PROMPT_VERSION, PromptConfig  # noqa: F401 (the version of this text)
from ..errors import RcllmError
from ..records import HistoryEntry, Item, ItemId

LABELS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")

INSTRUCTION = (
    "<|im_start|>system\nYou are a recommender system. You read a user's past reviews and "
    "pick, from a list of candidate items, the one the user will buy next.<|im_end|>\n"
    "<|im_start|>user\nMy past reviews, oldest first:")
ITEMS_HEADER = "\n\nCandidate items:"
QUESTIONS = {
    "verbalizer": ("\n\nWhich candidate will I buy next? Answer with its letter only."
                   "<|im_end|>\n<|im_start|>assistant\nAnswer: ("),
    "likelihood": ("\n\nWhich candidate will I buy next? Answer with its name."
                   "<|im_end|>\n<|im_start|>assistant\nI will buy next:"),
}
KINDS = ("instruction", "history", "item", "dynamic", "question")


@dataclass(frozen=True)
class RankRequest:
    """One ranking request. `history` is time-ordered (oldest first)."""

    user_id: str
    history: tuple[HistoryEntry, ...]
    candidates: tuple[ItemId, ...]
    request_time: int | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)  # e.g. method, item_ratio


@dataclass(frozen=True)
class Segment:
    kind: str                 # one of KINDS
    token_ids: tuple[int, ...]
    ref: str = ""             # item id (item/history chunks)

    @property
    def is_chunk(self) -> bool:
        return self.kind in ("history", "item")


@dataclass
class Prompt:
    segments: list[Segment]
    candidates: tuple[ItemId, ...]
    label_token_ids: tuple[int, ...]  # verbalizer tokens, one per candidate, in candidate order
    truncated_history: int = 0        # entries dropped (older than the window)
    # pointwise: one block of segments per candidate after the shared segments, each seeing
    # those and itself only (prefill.layout.Layout); empty for the listwise prompt
    blocks: list[list[Segment]] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        """The shared segments' ids (the whole prompt when there are no blocks)."""
        return [t for s in self.segments for t in s.token_ids]

    def __len__(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    def slot_segments(self) -> list[Segment]:
        """Every segment in KV-slot order: the shared ones, then each block's."""
        return self.segments + [s for b in self.blocks for s in b]

    def block_ranges(self) -> list[tuple[int, int]]:
        """Slot ranges [start, end) of the blocks."""
        out, at = [], len(self)
        for b in self.blocks:
            n = sum(len(s.token_ids) for s in b)
            out.append((at, at + n))
            at += n
        return out


ITEM_TAG_TOKENS = 4  # title tokens in an item chunk's ending (after " |")
NAME_TOKENS = 9     # the name's tokens at the head of a "lead" item chunk
BRAND_TOKENS = 6    # the brand's (with " ("), after the name in a "lead" item chunk
HISTORY_NAME_TOKENS = 8  # the name's tokens in a compact history chunk
# a compact history chunk's rating: one token each for this tokenizer (SmolLM2's)
RATING_WORDS = {1: "hated", 2: "poor", 3: "okay", 4: "liked", 5: "loved"}


def item_text(item: Item) -> str:
    title = item.title.strip() or f"item {item.item_id}"
    desc = " ".join(item.description.split())
    return f"{title}. {desc}" if desc else title


def item_tag(item: Item) -> str:
    """What an item chunk ends in: the item's name — its title without a "Publisher — " lead
    or a trailing "(1995)"-style year. An item tail (`reuse.item_tail`) recomputes a chunk's
    last tokens, seeing the user: they should name the item, not be a year digit or the
    middle of a description."""
    title = item.title.strip()
    name = title.split(" — ", 1)[1] if " — " in title else title
    name = re.sub(r"\s*\(\d{4}\)\s*$", "", name).strip()
    return name or title or f"item {item.item_id}"


def item_brand(item: Item) -> str:
    """The lead of a "Brand — text" title (what the loaders build from a brand and a
    description when an item has no usable title: Magazine's publishers), else `item_tag`."""
    title = item.title.strip()
    lead = title.split(" — ", 1)[0].strip() if " — " in title else ""
    return lead or item_tag(item)


def description_rest(item: Item, name: str) -> str:
    """The item's description without the lead the name already took (Magazine's display
    title is "Publisher — <the description's first sentence>")."""
    desc = " ".join(item.description.split())
    stem = name.rstrip(". …").strip()
    return desc[len(stem):].lstrip(" .…") if stem and desc.startswith(stem) else desc


def rating_word(rating: float) -> str:
    return RATING_WORDS[min(5, max(1, int(round(rating))))]


def history_text(entry: HistoryEntry, item: Item | None) -> str:
    title = item.title.strip() if item is not None and item.title.strip() else f"item {entry.item_id}"
    when = _dt.datetime.fromtimestamp(entry.timestamp, _dt.timezone.utc).strftime("%Y-%m-%d")
    return f"[{when}, {entry.rating:g}/5] {title}: {' '.join(entry.review.split())}"


class PromptBuilder:
    def __init__(self, tokenizer: Any, catalog: Mapping[ItemId, Item], cfg: PromptConfig,
                 max_context: int, scorer: str = "verbalizer"):
        if scorer not in QUESTIONS:
            raise RcllmError(f"unknown scorer {scorer!r}; use {' or '.join(QUESTIONS)}")
        self.tok = tokenizer
        self.catalog = catalog
        self.cfg = cfg
        self.max_context = max_context
        self.scorer = scorer
        self._instruction = self._encode(INSTRUCTION)
        self._header = self._encode(ITEMS_HEADER)
        self._question = self._encode(QUESTIONS[scorer])
        self._bullet = self._encode("\n-")
        self._labels = tuple(self._single_token(c) for c in LABELS)
        self._chunk_cache: dict[tuple[str, str], tuple[int, ...]] = {}

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tok(text, add_special_tokens=False)["input_ids"])

    def _single_token(self, text: str) -> int:
        ids = self._encode(text)
        if len(ids) != 1:
            raise RcllmError(f"label {text!r} is not a single token for this tokenizer")
        return ids[0]

    @property
    def instruction_ids(self) -> tuple[int, ...]:
        return self._instruction

    def context_ids(self, kind: str) -> tuple[int, ...]:
        """Typical dynamic text right before a chunk of `kind` (used to build its KV)."""
        if kind == "item":
            return self._header + self._encode("\n(A)")
        return self._bullet

    def item_chunk(self, item_id: ItemId) -> tuple[int, ...]:
        """" <title>. <description>" cut to fit, then " | <tag>" (`item_tag`, at most
        ITEM_TAG_TOKENS tokens and half the limit): at most `max_item_tokens` ids.
        `prompt.item_ending=text`: the text alone, cut at the limit (prompt version 1);
        `brand`: " | <brand>" (`item_brand`) in place of the name."""
        key = ("item", item_id)
        if key not in self._chunk_cache:
            item, limit = self.catalog[item_id], self.cfg.max_item_tokens
            if self.cfg.item_ending == "lead":
                self._chunk_cache[key] = self._lead_chunk(item)[:limit]
                return self._chunk_cache[key]
            if self.cfg.item_ending == "text":
                self._chunk_cache[key] = self._encode(" " + item_text(item))[:limit]
                return self._chunk_cache[key]
            name = item_brand(item) if self.cfg.item_ending == "brand" else item_tag(item)
            tag = self._encode(" | " + name)[: 1 + min(ITEM_TAG_TOKENS, limit // 2)]
            body = self._encode(" " + item_text(item))[: max(1, limit - len(tag))]
            self._chunk_cache[key] = (body + tag)[:limit]
        return self._chunk_cache[key]

    def _lead_chunk(self, item: Item) -> tuple[int, ...]:
        """" <name> (<brand>). <the rest of the description>": what identifies the item first
        (the name, at most NAME_TOKENS; the brand when it is not the name, at most
        BRAND_TOKENS), the description after it."""
        name = item_tag(item)
        brand = item_brand(item)
        ids = self._encode(" " + name)[:NAME_TOKENS]
        if brand != name:
            ids += self._encode(" (" + brand)[:BRAND_TOKENS] + self._encode(")")
        rest = description_rest(item, name)
        return ids + (self._encode(". " + rest) if rest else ())

    def forget_item(self, item_id: ItemId) -> None:
        """Drops the memoised token ids of an item (call after its text changes)."""
        self._chunk_cache.pop(("item", item_id), None)

    def history_chunk(self, entry: HistoryEntry) -> tuple[int, ...]:
        """`prompt.history_style=compact`: " <rating word> <name>: <review>" (one token of
        rating, at most HISTORY_NAME_TOKENS of name, the rest review text); `dated`: `history_text`.
        Cut at max_review_tokens."""
        item = self.catalog.get(entry.item_id)
        if self.cfg.history_style == "dated":
            ids = self._encode(" " + history_text(entry, item))
            return ids[: self.cfg.max_review_tokens]
        name = item_tag(item) if item is not None else f"item {entry.item_id}"
        ids = (self._encode(" " + rating_word(entry.rating)) + self._encode(" " + name)
               [:HISTORY_NAME_TOKENS] + self._encode(":"))
        review = " ".join(entry.review.split())
        return (ids + (self._encode(" " + review) if review else ()))[: self.cfg.max_review_tokens]

    def validate(self, req: RankRequest) -> None:
        if not req.candidates:
            raise RcllmError("the request has no candidates")
        if len(req.candidates) > self.cfg.max_candidates:
            raise RcllmError(f"{len(req.candidates)} candidates but at most "
                             f"{self.cfg.max_candidates} labels (prompt.max_candidates)")
        if len(set(req.candidates)) != len(req.candidates):
            raise RcllmError("the candidate list names an item twice")
        unknown = [c for c in req.candidates if c not in self.catalog]
        if unknown:
            raise RcllmError(f"unknown candidate item id {unknown[0]!r}")

    def history_segments(self, history: Sequence[HistoryEntry]) -> tuple[list[Segment], int]:
        """Bullet + history chunk segments of the last `history_window` entries, and how many
        older entries were dropped (shared by the listwise and the pointwise prompt)."""
        window = self.cfg.history_window
        kept = list(history)[-window:] if window else []
        segs = []
        for entry in kept:
            segs.append(Segment("dynamic", self._bullet))
            segs.append(Segment("history", self.history_chunk(entry), entry.item_id))
        return segs, len(history) - len(kept)

    def build(self, req: RankRequest) -> Prompt:
        """Builds the prompt; raises RcllmError for bad input or a prompt over the context."""
        self.validate(req)
        history, dropped = self.history_segments(req.history)
        segs = [Segment("instruction", self._instruction), *history]
        segs.append(Segment("dynamic", self._header))
        for label, item_id in zip(LABELS, req.candidates):
            segs.append(Segment("dynamic", self._encode(f"\n({label})")))
            segs.append(Segment("item", self.item_chunk(item_id), item_id))
        segs.append(Segment("question", self._question))
        prompt = Prompt(segs, tuple(req.candidates), self._labels[: len(req.candidates)],
                        truncated_history=dropped)
        if len(prompt) > self.max_context:
            raise RcllmError(f"the prompt has {len(prompt)} tokens, over the model's context of "
                             f"{self.max_context}; lower prompt.history_window or the token limits")
        return prompt

    def continuation_ids(self, item_id: ItemId) -> tuple[int, ...]:
        """Tokens scored by the likelihood scorer: the item's title after the prompt."""
        item = self.catalog[item_id]
        title = item.title.strip() or f"item {item_id}"
        return self._encode(" " + title)[:24]
