"""What a launched process builds, shared by the CLI commands and the server: the config from
`--config`/`--set`, the dataset by name, and an engine on a checked, tiered chunk store with a
tuned adapter adopted whole.

`make_stored_engine` builds memory → disk
(`kvstore.wiring.build_store`), the engine, then hands every tier the engine's `KeyCheck`
(fingerprint + the kind tags it really keys chunks under), so entries on disk are validated on
read and a put with a foreign key is refused. `adopt_adapter` applies `--adapter PATH`: the
model's adapter, the prompt settings it was trained with, its scorer and its default method.
"""

from __future__ import annotations

import dataclasses
import os

from .config import RcllmConfig, load

DEFAULT_SYNTHETIC = {"num_users": 60, "num_items": 120, "seed": 0}


def engine_config(args) -> RcllmConfig:
    return load(RcllmConfig, args.config, args.overrides)


def load_data(args):
    """The dataset named by --data/--format/--category, or the built-in synthetic one."""
    from .eval.datasets import load_dataset

    if args.data is None or args.format == "synthetic":
        return load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)
    opts = {}
    if args.format.startswith("amazon"):
        opts["category"] = args.category or _first_category(args.data)
    return load_dataset(args.data, args.format, **opts)


def _first_category(path: str) -> str | None:
    if not os.path.isdir(path):
        return None
    names = sorted(f[:-len("_5.json")] for f in os.listdir(path) if f.endswith("_5.json"))
    return names[0] if names else None


@dataclasses.dataclass(frozen=True)
class Adopted:
    cfg: RcllmConfig
    scorer: str
    adapter: str | None


def chosen_options(config: str | None, overrides) -> frozenset[str]:
    """The dotted option names the user set (`--set KEY=...` or the YAML file, nested or
    dotted), whatever their values: an adapter's setting gives way to these only, so setting
    an option to its default value (`--set reuse.late_layer=20`) is a choice too."""
    out = {o.split("=", 1)[0].strip() for o in overrides}
    if not config:
        return frozenset(out)
    import yaml

    try:
        with open(config, encoding="utf-8") as fh:
            tree = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError):
        return frozenset(out)      # engine_config() reports the file's problem
    todo = [("", tree)] if isinstance(tree, dict) else []
    while todo:
        prefix, node = todo.pop()
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                todo.append((name + ".", value))
            else:
                out.add(name)
    return frozenset(out)


def adopt_adapter(cfg: RcllmConfig, adapter: str | None, scorer: str | None,
                  chosen: frozenset[str] | None = None) -> Adopted:
    """`cfg` with the adapter at `adapter` (else model.adapter) set, its prompt settings and
    the fast path its manifest names, keeping the options the user set (`chosen`, from
    `chosen_options`; None: those that differ from their defaults, and the method is the
    adapter's): its method unless reuse.method is among them. The scorer is `scorer` when
    given, else the adapter's, else the verbalizer.
    Raises RcllmError for an unreadable adapter or conflicting prompt settings (see
    finetune.adapter.eval_settings)."""
    path = adapter or cfg.model.adapter or None
    if not path:
        return Adopted(cfg, scorer or "verbalizer", None)
    from .finetune.adapter import eval_settings, trained_method, trained_scorer

    cfg, _fractions, _seed = eval_settings(cfg, path, chosen)
    if chosen is None or "reuse.method" not in chosen:
        cfg = dataclasses.replace(cfg, reuse=dataclasses.replace(cfg.reuse,
                                                                 method=trained_method(path)))
    return Adopted(cfg, scorer or trained_scorer(path), str(path))


def make_stored_engine(cfg: RcllmConfig, items, scorer: str = "verbalizer",
                       kv_dir: str | os.PathLike | None = None,
                       history_bytes: int | None = None, disk_bytes: int | None = None,
                       redis_url: str | None = None, encoding: str = "raw"):
    """The engine over `items` (a dict it may mutate) on a store per `build_store`, with the
    engine's KeyCheck attached to every tier."""
    from .engine import Engine
    from .kvstore.wiring import (DEFAULT_DISK_BYTES, attach_check, build_store,
                                  engine_key_check)
    from .model.loading import load_model

    loaded = load_model(cfg.model)
    store = build_store(cfg.reuse.store_bytes, kv_dir, disk_bytes or DEFAULT_DISK_BYTES,
                        history_bytes, encoding, redis_url, cfg.reuse.behind_nice)
    engine = Engine(loaded, items, cfg, store=store, scorer=scorer)
    attach_check(store, engine_key_check(engine))
    return engine
