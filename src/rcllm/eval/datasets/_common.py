"""Helpers shared by the loaders: token estimates, HTML cleanup, safe JSON-lines reading.

Reading contract (`iter_json_lines`): every non-blank line must be a JSON object. A line that
is not valid UTF-8 or not valid JSON (e.g. a truncated last line) raises `RcllmError` naming
the file and the 1-based line number, unless `on_error="skip"`, in which case it is counted in
`skipped` under "bad_encoding" / "bad_json" / "not_an_object". Nothing is dropped silently.
"""

from __future__ import annotations

import gzip
import html
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

from rcllm.errors import RcllmError

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_TAG_RE = re.compile(r"<[^>]*>?")
_SPACE_RE = re.compile(r"\s+")
ON_ERROR = ("raise", "skip")


def approx_tokens(text: str) -> int:
    """Words plus punctuation marks: a tokenizer-free estimate of BPE tokens for English text."""
    return len(_TOKEN_RE.findall(text))


def clean_text(text: str) -> str:
    """Strips HTML tags (also an unterminated trailing one), unescapes entities, collapses space."""
    return _SPACE_RE.sub(" ", html.unescape(_TAG_RE.sub(" ", text))).strip()


def truncate_words(text: str, max_words: int | None) -> str:
    """First max_words words of text, with '…' appended when something was cut."""
    if max_words is None:
        return text
    words = text.split(" ")
    return text if len(words) <= max_words else " ".join(words[:max_words]) + " …"


def require_file(path: str | os.PathLike, what: str) -> Path:
    """The path as a Path, or RcllmError saying which file is missing."""
    p = Path(path)
    if not p.is_file():
        raise RcllmError(f"{what} not found: {p}")
    return p


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR:
        raise RcllmError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")


def _raw_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"  # gzip magic, whatever the suffix says
    try:
        with (gzip.open(path, "rb") if gz else path.open("rb")) as fh:
            yield from fh
    except (OSError, EOFError) as exc:  # corrupt or truncated gzip stream
        raise RcllmError(f"{path}: cannot read ({exc})") from exc


def iter_json_lines(path: Path, skipped: Counter, on_error: str = "raise"
                    ) -> Iterator[tuple[int, dict]]:
    """Yields (line number, object) for each JSON object line of a plain or gzip file."""
    check_on_error(on_error)
    for lineno, raw in enumerate(_raw_lines(path), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if on_error == "skip":
                skipped["bad_encoding"] += 1
                continue
            raise RcllmError(f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column "
                             f"{exc.start + 1}); re-encode the file as UTF-8 or pass "
                             f"on_error='skip'") from exc
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            if on_error == "skip":
                skipped["bad_json"] += 1
                continue
            raise RcllmError(f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno}); "
                             f"a truncated file? pass on_error='skip' to count and skip "
                             f"such lines") from exc
        if not isinstance(obj, dict):
            if on_error == "skip":
                skipped["not_an_object"] += 1
                continue
            raise RcllmError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def find_file(folder: Path, names: list[str], what: str) -> Path:
    """The first of `names` that exists in `folder`, or RcllmError listing what was tried."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise RcllmError(f"{what} not found in {folder}: tried {', '.join(names)}")


def data_files(path: str, source: str, reviews_in: Callable[[str | None], list[str]],
               side_path: str | None, side_label: str,
               side_in: Callable[[Path], tuple[list[str], str]],
               option: tuple[str, str | None, str] | None = None) -> tuple[Path, Path]:
    """The review file and its side file (item metadata, books, businesses) of a data set.

    `path` is a folder or a review file. In a folder the review file is one of
    `reviews_in(value)`, where `option` = (name, value, example) is the option that names it
    (a category, a genre; RcllmError when a folder is given without it). The side file is
    `side_path` when given (RcllmError "<side_label> not found" when it is not a file), else the
    first of `side_in(reviews)` = (names, what) found beside the review file."""
    p = Path(path)
    if p.is_dir():
        if option is not None and not option[1]:
            raise RcllmError(f"{p} is a folder: pass the {option[0]} option (e.g. "
                             f"{option[0]}={option[2]!r}) or a review file")
        value = option[1] if option is not None else None
        reviews = find_file(p, reviews_in(value), f"{value} review file" if value
                            else f"{source} review file")
    elif p.is_file():
        reviews = p
    else:
        raise RcllmError(f"{source} data not found: {p}")
    if side_path:
        side = Path(side_path)
        if not side.is_file():
            raise RcllmError(f"{side_label} not found: {side}")
    else:
        names, what = side_in(reviews)
        side = find_file(reviews.parent, names, what)
    return reviews, side


def first_sentence(text: str, max_words: int = 12) -> str:
    """The first sentence of text (split at '. ', '! ', '? '), cut to max_words words."""
    cut = len(text)
    for mark in (". ", "! ", "? "):
        pos = text.find(mark)
        if 0 <= pos < cut:
            cut = pos + 1
    return truncate_words(text[:cut].strip(), max_words)


def text_list(value: object) -> str:
    """A string or a list of strings (as in Amazon metadata), cleaned and joined by spaces."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return " ".join(t for t in (clean_text(v) for v in value if isinstance(v, str)) if t)
    return ""


def as_float(value: object) -> float | None:
    """A finite float from a number or numeric string, else None."""
    if isinstance(value, bool):
        return None
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return out if out == out and abs(out) != float("inf") else None
