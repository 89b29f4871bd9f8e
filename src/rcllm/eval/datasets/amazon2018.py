"""Amazon Review Data (2018): 5-core review JSON-lines + `meta_<Category>.json[.gz]`.

`path` is either a folder (then `category`, e.g. "Magazine_Subscriptions", names the files
`<category>_5.json[.gz]` and `meta_<category>.json[.gz]`) or a review file (its metadata is
looked up next to it, or given as `meta_path`).

Field mapping: user = `reviewerID`, item = `asin`, rating = `overall`, timestamp =
`unixReviewTime` (seconds, day-granular), review = `reviewText` (falls back to `summary` when
empty or absent). Item: description = cleaned `description` list (HTML stripped; falls back
to `feature`), cut to `max_description_words`; category = the distinct `category` path joined
with " > " (or `main_cat`).

Display title fallback: a title that is empty after HTML stripping (148 of 151 Magazine items
carry the scraping artefact `<span class="a-size-medium a-color-secondary"`) is replaced by
`brand` + " — " + the description's first sentence (≤ 12 words), since the magazine's name
is usually in one of the two; with neither, "Amazon item <asin>".

Skips: missing `reviewerID`/`asin`/`overall`/`unixReviewTime` → "missing_field:<name>",
a non-numeric rating or time → "bad_value:<name>", meta rows without `asin` →
"missing_field:asin", plus the build rules of `_builder` (duplicate lines, unknown items, ...).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rcllm.errors import RcllmError
from rcllm.records import Dataset, Item, ItemId

from ._builder import DatasetBuilder
from ._common import (as_float, check_on_error, clean_text, data_files, first_sentence,
                      iter_json_lines, text_list, truncate_words)

log = logging.getLogger(__name__)


def _files(path: str, category: str | None, meta_path: str | None) -> tuple[Path, Path, str]:
    def cat(reviews: Path) -> str:  # a review file given alone names its category
        return category or reviews.name.split(".")[0].removesuffix("_5")

    reviews, meta = data_files(
        path, "Amazon 2018",
        lambda c: [f"{c}_5.json", f"{c}_5.json.gz", f"{c}.json", f"{c}.json.gz"],
        meta_path, "metadata file",
        lambda r: ([f"meta_{cat(r)}.json", f"meta_{cat(r)}.json.gz"], f"metadata for {cat(r)}"),
        ("category", category, "Magazine_Subscriptions"))
    return reviews, meta, cat(reviews)


def item_from_meta(row: dict, max_description_words: int | None) -> Item:
    """An Item from one metadata row, with the display-title fallback of the module docstring."""
    asin = str(row["asin"])
    description = text_list(row.get("description")) or text_list(row.get("feature"))
    title = clean_text(row["title"]) if isinstance(row.get("title"), str) else ""
    if not title:
        brand = clean_text(row["brand"]) if isinstance(row.get("brand"), str) else ""
        parts = [t for t in (brand, first_sentence(description)) if t]
        title = " — ".join(parts) if parts else f"Amazon item {asin}"
    path = [clean_text(c) for c in row.get("category") or [] if isinstance(c, str)]
    category = " > ".join(dict.fromkeys(c for c in path if c))
    if not category and isinstance(row.get("main_cat"), str):
        category = clean_text(row["main_cat"])
    return Item(ItemId(asin), title, truncate_words(description, max_description_words), category)


_REQUIRED = ("reviewerID", "asin", "overall", "unixReviewTime")


def _read_reviews(b: DatasetBuilder, reviews: Path, on_error: str, max_lines: int | None) -> None:
    for lineno, row in iter_json_lines(reviews, b.skipped, on_error):
        if max_lines is not None and lineno > max_lines:
            break
        missing = next((f for f in _REQUIRED if row.get(f) in (None, "")), None)
        if missing:
            b.skip(f"missing_field:{missing}")
            continue
        rating, ts = as_float(row["overall"]), as_float(row["unixReviewTime"])
        if rating is None or ts is None:
            b.skip("bad_value:overall" if rating is None else "bad_value:unixReviewTime")
            continue
        text = row.get("reviewText") or row.get("summary") or ""
        b.add_interaction(str(row["reviewerID"]), str(row["asin"]), rating,
                          clean_text(text) if isinstance(text, str) else "", int(ts))


def load(path: str, *, category: str | None = None, meta_path: str | None = None,
         max_description_words: int | None = 100, on_error: str = "raise",
         max_lines: int | None = None, keep_unused_items: bool = False) -> Dataset:
    """Loads one Amazon 2018 category (see the module docstring for mapping and skips).

    `max_lines` reads only the first review lines; `on_error="skip"` counts undecodable or
    invalid JSON lines instead of raising.
    """
    check_on_error(on_error)
    reviews, meta, category = _files(path, category, meta_path)
    b = DatasetBuilder(f"amazon2018-{category}")
    _read_reviews(b, reviews, on_error, max_lines)
    wanted = b.interacted_items() if not keep_unused_items else None
    fallbacks = 0
    for _, row in iter_json_lines(meta, b.skipped, on_error):
        if not row.get("asin"):
            b.skip("missing_field:asin")
        elif wanted is not None and str(row["asin"]) not in wanted:
            b.skip("item_without_interactions")
        else:
            item = item_from_meta(row, max_description_words)
            fallbacks += not (isinstance(row.get("title"), str) and clean_text(row["title"]))
            b.add_item(item)
    if fallbacks:
        log.info("%s: %d metadata rows had no usable title; used brand + description",
                 meta, fallbacks)
    return b.build(keep_unused_items)
