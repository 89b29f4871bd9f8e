"""Yelp Open Dataset: review and business JSON-lines.

`path` is the folder holding `yelp_academic_dataset_review.json` and
`yelp_academic_dataset_business.json` (the official names; `review.json` / `business.json`
and `.gz` variants are accepted too), or the review file itself (`business_path` then names
the business file, else it is looked up next to it).

Field mapping: user = `user_id`, item = `business_id`, rating = `stars`, review = `text`,
timestamp = `date` ("YYYY-MM-DD HH:MM:SS", read as UTC). Item: title = `name`, category =
`categories` (a comma-separated string), description = "<categories>. <address>, <city>,
<state>." — Yelp has no item description, so the description says what and where the business
is, cut to `max_description_words`.

Skips: "missing_field:<name>" for user_id/business_id/stars/date (and business_id/name in
business rows), "bad_value:stars", "bad_value:date", plus the `_builder` rules.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from rcllm.errors import RcllmError
from rcllm.records import Dataset, Item, ItemId

from ._builder import DatasetBuilder
from ._common import as_float, check_on_error, clean_text, data_files, iter_json_lines, truncate_words

_REVIEWS = ["yelp_academic_dataset_review.json", "review.json",
            "yelp_academic_dataset_review.json.gz", "review.json.gz"]
_BUSINESS = ["yelp_academic_dataset_business.json", "business.json",
             "yelp_academic_dataset_business.json.gz", "business.json.gz"]


def _files(path: str, business_path: str | None) -> tuple[Path, Path]:
    return data_files(path, "Yelp", lambda _: _REVIEWS, business_path, "Yelp business file",
                      lambda _: (_BUSINESS, "Yelp business file"))


def parse_date(value: str) -> int | None:
    """Seconds since the epoch for "YYYY-MM-DD[ HH:MM:SS]" (UTC), or None."""
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return int(datetime.strptime(value.strip(), fmt).replace(tzinfo=timezone.utc)
                       .timestamp())
        except ValueError:
            continue
    return None


def _item(row: dict, max_description_words: int | None) -> Item:
    cats = clean_text(row["categories"]) if isinstance(row.get("categories"), str) else ""
    place = ", ".join(clean_text(str(row[k])) for k in ("address", "city", "state")
                      if row.get(k))
    description = ". ".join(t for t in (cats, place) if t) + ("." if cats or place else "")
    return Item(ItemId(str(row["business_id"])), clean_text(str(row["name"])),
                truncate_words(description, max_description_words), cats)


def load(path: str, *, business_path: str | None = None, max_description_words: int | None = 100,
         on_error: str = "raise", max_lines: int | None = None,
         keep_unused_items: bool = False) -> Dataset:
    """Loads Yelp reviews and businesses (see the module docstring for mapping and skips)."""
    check_on_error(on_error)
    reviews, business = _files(path, business_path)
    b = DatasetBuilder("yelp")
    for lineno, row in iter_json_lines(reviews, b.skipped, on_error):
        if max_lines is not None and lineno > max_lines:
            break
        missing = next((f for f in ("user_id", "business_id", "stars", "date")
                        if row.get(f) in (None, "")), None)
        if missing:
            b.skip(f"missing_field:{missing}")
            continue
        stars = as_float(row["stars"])
        ts = parse_date(row["date"]) if isinstance(row["date"], str) else None
        if stars is None or ts is None:
            b.skip("bad_value:stars" if stars is None else "bad_value:date")
            continue
        text = row.get("text")
        b.add_interaction(str(row["user_id"]), str(row["business_id"]), stars,
                          clean_text(text) if isinstance(text, str) else "", ts)
    wanted = None if keep_unused_items else b.interacted_items()
    for _, row in iter_json_lines(business, b.skipped, on_error):
        missing = next((f for f in ("business_id", "name") if not row.get(f)), None)
        if missing:
            b.skip(f"missing_field:{missing}")
        elif wanted is not None and str(row["business_id"]) not in wanted:
            b.skip("item_without_interactions")
        else:
            b.add_item(_item(row, max_description_words))
    return b.build(keep_unused_items)
