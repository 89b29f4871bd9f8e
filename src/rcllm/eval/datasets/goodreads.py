"""Goodreads (UCSD Book Graph): reviews and books JSON-lines (usually gzip).

`path` is a folder (with the `genre` option, e.g. "poetry", naming
`goodreads_reviews_<genre>.json[.gz]` and `goodreads_books_<genre>.json[.gz]`) or a review
file (`books_path` names the books file, else "reviews" → "books" in its name is tried).

Field mapping: user = `user_id`, item = `book_id`, rating = `rating` (0-5; Goodreads uses 0
for "shelved without a rating" — kept as 0.0, not skipped), review = `review_text`, timestamp
= `date_added` (fallback `date_updated`; "Fri Aug 25 13:55:02 -0700 2017"). Item: title =
`title` (fallback `title_without_series`, then "Book <id>"), description = `description`
cut to `max_description_words`, category = the `genre` option if given, else the book's most
shelved `popular_shelves` name that is not a reading-status shelf (to-read, currently-reading,
favorites, owned, ...). Author names are in a separate file and are not read.

Skips: "missing_field:<name>" for user_id/book_id/rating/date_added, "bad_value:<name>",
books rows without `book_id`, plus the `_builder` rules.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rcllm.errors import RcllmError
from rcllm.records import Dataset, Item, ItemId

from ._builder import DatasetBuilder
from ._common import as_float, check_on_error, clean_text, data_files, iter_json_lines, truncate_words

_STATUS_SHELVES = frozenset({"to-read", "currently-reading", "favorites", "owned", "books-i-own",
                             "owned-books", "default", "my-books", "library", "wish-list",
                             "kindle", "ebook", "ebooks", "read", "to-buy", "dnf"})


def _files(path: str, genre: str | None, books_path: str | None) -> tuple[Path, Path]:
    def books(reviews: Path) -> tuple[list[str], str]:
        name = reviews.name.replace("reviews", "books")
        return [name] if name != reviews.name else [], "Goodreads books file (pass books_path)"

    return data_files(path, "Goodreads", lambda g: [f"goodreads_reviews_{g}.json",
                                                    f"goodreads_reviews_{g}.json.gz"],
                      books_path, "Goodreads books file", books, ("genre", genre, "poetry"))


def parse_goodreads_date(value: str) -> int | None:
    """Seconds since the epoch for "Fri Aug 25 13:55:02 -0700 2017", or None."""
    try:
        return int(datetime.strptime(value.strip(), "%a %b %d %H:%M:%S %z %Y").timestamp())
    except ValueError:
        return None


def _category(row: dict, genre: str | None) -> str:
    if genre:
        return genre
    shelves = [s for s in row.get("popular_shelves") or [] if isinstance(s, dict)]
    shelves.sort(key=lambda s: -(as_float(s.get("count")) or 0.0))  # stable for equal counts
    return next((str(s["name"]) for s in shelves
                 if s.get("name") and str(s["name"]) not in _STATUS_SHELVES), "")


def _item(row: dict, genre: str | None, max_description_words: int | None) -> Item:
    book_id = str(row["book_id"])
    title = next((clean_text(row[k]) for k in ("title", "title_without_series")
                  if isinstance(row.get(k), str) and clean_text(row[k])), f"Book {book_id}")
    desc = clean_text(row["description"]) if isinstance(row.get("description"), str) else ""
    return Item(ItemId(book_id), title, truncate_words(desc, max_description_words),
                _category(row, genre))


def load(path: str, *, genre: str | None = None, books_path: str | None = None,
         max_description_words: int | None = 100, on_error: str = "raise",
         max_lines: int | None = None, keep_unused_items: bool = False) -> Dataset:
    """Loads Goodreads reviews and books (see the module docstring for mapping and skips)."""
    check_on_error(on_error)
    reviews, books = _files(path, genre, books_path)
    b = DatasetBuilder(f"goodreads-{genre}" if genre else "goodreads")
    for lineno, row in iter_json_lines(reviews, b.skipped, on_error):
        if max_lines is not None and lineno > max_lines:
            break
        date = row.get("date_added") or row.get("date_updated")
        missing = next((f for f, v in (("user_id", row.get("user_id")),
                                       ("book_id", row.get("book_id")),
                                       ("rating", row.get("rating")), ("date_added", date))
                        if v in (None, "")), None)
        if missing:
            b.skip(f"missing_field:{missing}")
            continue
        rating = as_float(row["rating"])
        ts = parse_goodreads_date(date) if isinstance(date, str) else None
        if rating is None or ts is None:
            b.skip("bad_value:rating" if rating is None else "bad_value:date_added")
            continue
        text = row.get("review_text")
        b.add_interaction(str(row["user_id"]), str(row["book_id"]), rating,
                          clean_text(text) if isinstance(text, str) else "", ts)
    wanted = None if keep_unused_items else b.interacted_items()
    for _, row in iter_json_lines(books, b.skipped, on_error):
        if not row.get("book_id"):
            b.skip("missing_field:book_id")
        elif wanted is not None and str(row["book_id"]) not in wanted:
            b.skip("item_without_interactions")
        else:
            b.add_item(_item(row, genre, max_description_words))
    return b.build(keep_unused_items)
