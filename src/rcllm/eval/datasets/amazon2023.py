"""Amazon Reviews 2023 (McAuley Lab): `<Category>.jsonl[.gz]` + `meta_<Category>.jsonl[.gz]`.

`path` is a folder (with the `category` option, e.g. "All_Beauty") or a review file (its
metadata is looked up next to it as `meta_<name>`, or given as `meta_path`).

Field mapping: user = `user_id`, item = `parent_asin` (falls back to `asin`; metadata is keyed
by `parent_asin`), rating = `rating`, timestamp = `timestamp` // 1000 (the files use
milliseconds), review = `text` (falls back to the review's `title`). Item: title = `title`
(fallback `store` + the description's first sentence, then "Amazon item <id>"), description =
`description` list (fallback `features`), cut to `max_description_words`; category =
`categories` joined with " > " (fallback `main_category`).

Skips: "missing_field:<name>" for user_id/parent_asin/rating/timestamp, "bad_value:<name>"
for non-numeric rating or timestamp, plus the `_builder` rules.
"""

from __future__ import annotations

from pathlib import Path

from rcllm.errors import RcllmError
from rcllm.records import Dataset, Item, ItemId

from ._builder import DatasetBuilder
from ._common import (as_float, check_on_error, clean_text, data_files, first_sentence,
                      iter_json_lines, text_list, truncate_words)


def _files(path: str, category: str | None, meta_path: str | None) -> tuple[Path, Path, str]:
    def cat(reviews: Path) -> str:  # a review file given alone names its category
        return category or reviews.name.split(".")[0]

    reviews, meta = data_files(
        path, "Amazon 2023", lambda c: [f"{c}.jsonl", f"{c}.jsonl.gz"], meta_path, "metadata file",
        lambda r: ([f"meta_{cat(r)}.jsonl", f"meta_{cat(r)}.jsonl.gz"], f"metadata for {cat(r)}"),
        ("category", category, "All_Beauty"))
    return reviews, meta, cat(reviews)


def _item(row: dict, item_id: str, max_description_words: int | None) -> Item:
    description = text_list(row.get("description")) or text_list(row.get("features"))
    title = clean_text(row["title"]) if isinstance(row.get("title"), str) else ""
    if not title:
        store = clean_text(row["store"]) if isinstance(row.get("store"), str) else ""
        parts = [t for t in (store, first_sentence(description)) if t]
        title = " — ".join(parts) if parts else f"Amazon item {item_id}"
    cats = [clean_text(c) for c in row.get("categories") or [] if isinstance(c, str)]
    category = " > ".join(dict.fromkeys(c for c in cats if c))
    if not category and isinstance(row.get("main_category"), str):
        category = clean_text(row["main_category"])
    return Item(ItemId(item_id), title, truncate_words(description, max_description_words),
                category)


def load(path: str, *, category: str | None = None, meta_path: str | None = None,
         max_description_words: int | None = 100, on_error: str = "raise",
         max_lines: int | None = None, keep_unused_items: bool = False) -> Dataset:
    """Loads one Amazon 2023 category (see the module docstring for mapping and skips)."""
    check_on_error(on_error)
    reviews, meta, category = _files(path, category, meta_path)
    b = DatasetBuilder(f"amazon2023-{category}")
    for lineno, row in iter_json_lines(reviews, b.skipped, on_error):
        if max_lines is not None and lineno > max_lines:
            break
        item = row.get("parent_asin") or row.get("asin")
        missing = next((f for f, v in (("user_id", row.get("user_id")), ("parent_asin", item),
                                       ("rating", row.get("rating")),
                                       ("timestamp", row.get("timestamp"))) if v in (None, "")),
                       None)
        if missing:
            b.skip(f"missing_field:{missing}")
            continue
        rating, ts_ms = as_float(row["rating"]), as_float(row["timestamp"])
        if rating is None or ts_ms is None:
            b.skip("bad_value:rating" if rating is None else "bad_value:timestamp")
            continue
        text = row.get("text") or row.get("title") or ""
        b.add_interaction(str(row["user_id"]), str(item), rating,
                          clean_text(text) if isinstance(text, str) else "", int(ts_ms) // 1000)
    wanted = None if keep_unused_items else b.interacted_items()
    for _, row in iter_json_lines(meta, b.skipped, on_error):
        item_id = row.get("parent_asin") or row.get("asin")
        if not item_id:
            b.skip("missing_field:parent_asin")
        elif wanted is not None and str(item_id) not in wanted:
            b.skip("item_without_interactions")
        else:
            b.add_item(_item(row, str(item_id), max_description_words))
    return b.build(keep_unused_items)
