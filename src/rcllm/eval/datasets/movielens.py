"""MovieLens in RecBole atomic format: `<name>.inter` + `<name>.item` (TSV, typed header).

`path` is the `.inter` file or a folder holding exactly one `*.inter` (or pass `name`); the
`.item` file with the same stem sits next to it. Header cells are `field:type`; columns are
found by field name, so column order does not matter.

Field mapping: user = `user_id`, item = `item_id`, rating = `rating`, timestamp = `timestamp`.
Item: title = "`movie_title` (`release_year`)", description = "Released <year>. Genres:
<class>." (MovieLens has no plot text), category = `class` (space-separated genres).

Review text: MovieLens has none, so `HistoryEntry.review` is "" by default — the dataset is
the no-review control (history = titles + ratings). `review_template`, e.g. "Rated
{rating:g}/5.", fills it instead; the slots are `rating` and `title`.

Skips: "placeholder_item" for the "unknown"/"unkonwn" placeholder movie (ML-100K item 267)
and "unknown_item" for its ratings; "bad_value:<name>" for non-numeric rating/timestamp;
with on_error="skip", "bad_row" (wrong number of cells) and "bad_encoding". Otherwise such
rows raise RcllmError naming file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from rcllm.errors import RcllmError
from rcllm.records import Dataset, Item, ItemId

from ._builder import DatasetBuilder
from ._common import as_float, check_on_error, require_file

_PLACEHOLDER_TITLES = frozenset({"unknown", "unkonwn"})


def _files(path: str, name: str | None) -> tuple[Path, Path]:
    p = Path(path)
    if p.is_dir():
        inters = [p / f"{name}.inter"] if name else sorted(p.glob("*.inter"))
        if len(inters) != 1 or not inters[0].is_file():
            raise RcllmError(f"{p}: expected exactly one .inter file (or pass name=...), "
                             f"found {[i.name for i in inters if i.is_file()]}")
        inter = inters[0]
    elif p.is_file():
        inter = p
    else:
        raise RcllmError(f"MovieLens data not found: {p}")
    return inter, require_file(inter.with_suffix(".item"), "MovieLens item file")


def read_atomic(path: Path, required: tuple[str, ...], skipped: dict[str, int],
                on_error: str) -> Iterator[tuple[int, dict[str, str]]]:
    """Yields (line number, {field: cell}) for each row of a RecBole atomic TSV file."""
    with path.open("rb") as fh:
        header: list[str] | None = None
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                if on_error == "skip" and header is not None:
                    skipped["bad_encoding"] = skipped.get("bad_encoding", 0) + 1
                    continue
                raise RcllmError(f"{path}:{lineno}: not UTF-8 (byte at column "
                                 f"{exc.start + 1}); re-encode the file as UTF-8") from exc
            if header is None:
                header = [cell.split(":")[0] for cell in line.split("\t")]
                missing = [f for f in required if f not in header]
                if missing:
                    raise RcllmError(f"{path}:1: header lacks {', '.join(missing)} "
                                     f"(found {', '.join(header)})")
                continue
            if not line.strip():
                continue
            cells = line.split("\t")
            if len(cells) != len(header):
                if on_error == "skip":
                    skipped["bad_row"] = skipped.get("bad_row", 0) + 1
                    continue
                raise RcllmError(f"{path}:{lineno}: {len(cells)} cells, header has "
                                 f"{len(header)}")
            yield lineno, dict(zip(header, cells))
        if header is None:
            raise RcllmError(f"{path}: empty file (no header)")


def _item(row: dict[str, str]) -> Item:
    title, year = row["movie_title"].strip(), row.get("release_year", "").strip()
    genres = row.get("class", "").strip()
    parts = [f"Released {year}." if year else "", f"Genres: {genres}." if genres else ""]
    return Item(ItemId(row["item_id"]), f"{title} ({year})" if year else title,
                " ".join(p for p in parts if p), genres)


def load(path: str, *, name: str | None = None, review_template: str | None = None,
         on_error: str = "raise", keep_unused_items: bool = False) -> Dataset:
    """Loads a RecBole atomic MovieLens dataset (see the module docstring)."""
    check_on_error(on_error)
    if review_template is not None:
        try:
            review_template.format(rating=4.0, title="")
        except (KeyError, IndexError, ValueError) as exc:
            raise RcllmError(f"review_template {review_template!r} is not a valid template "
                             f"with slots rating and title ({exc})") from exc
    inter, item_file = _files(path, name)
    b = DatasetBuilder(inter.stem)
    for _, row in read_atomic(item_file, ("item_id", "movie_title"), b.skipped, on_error):
        if row["movie_title"].strip().lower() in _PLACEHOLDER_TITLES:
            b.skip("placeholder_item")
        else:
            b.add_item(_item(row))
    for _, row in read_atomic(inter, ("user_id", "item_id", "rating", "timestamp"), b.skipped,
                              on_error):
        rating, ts = as_float(row["rating"]), as_float(row["timestamp"])
        if rating is None or ts is None:
            b.skip("bad_value:rating" if rating is None else "bad_value:timestamp")
            continue
        review = ""
        if review_template is not None:
            item = b.items.get(ItemId(row["item_id"]))
            review = review_template.format(rating=rating, title=item.title if item else "")
        b.add_interaction(row["user_id"], row["item_id"], rating, review, int(ts))
    return b.build(keep_unused_items)
