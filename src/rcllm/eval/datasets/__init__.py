"""Dataset loaders into the common model `rcllm.records.Dataset`, and one dispatcher.

`load_dataset(path, fmt, **options)` picks the loader by format name; each loader module
documents its options, field mapping and skip reasons (also collected in docs/datasets.md).
Every loader returns time-ordered histories (stable sort: ties keep file order, so
leave-last-out is deterministic) and counts what it could not use in `Dataset.skipped`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from rcllm.errors import RcllmError
from rcllm.records import Dataset

# format name -> (module, function); modules are imported only when their format is asked for
FORMATS: dict[str, tuple[str, str]] = {
    "amazon2018": ("amazon2018", "load"),
    "amazon2023": ("amazon2023", "load"),
    "yelp": ("yelp", "load"),
    "goodreads": ("goodreads", "load"),
    "movielens": ("movielens", "load"),
    "synthetic": ("synthetic", "load"),
}


def load_dataset(path: str, fmt: str, **options: Any) -> Dataset:
    """Loads the dataset at `path` in format `fmt` (one of FORMATS).

    For "synthetic", `path` is ignored and the options go to `synthetic.generate`.
    Raises RcllmError for an unknown format, a missing path, or an unreadable file.
    """
    if fmt not in FORMATS:
        raise RcllmError(f"unknown dataset format {fmt!r}; choose one of {', '.join(FORMATS)}")
    module_name, func = FORMATS[fmt]
    module = importlib.import_module(f"{__name__}.{module_name}")
    loader = getattr(module, func)
    params = inspect.signature(loader).parameters
    known = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY or n != "path"]
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise RcllmError(f"format {fmt!r} has no option(s) {', '.join(unknown)}; "
                             f"known: {', '.join(known)}")
    return loader(path, **options)


__all__ = ["FORMATS", "load_dataset"]
