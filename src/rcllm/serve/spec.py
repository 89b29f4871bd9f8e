"""How to build an engine, as plain picklable data (Ray ships it to each instance actor)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from ..records import Dataset


@dataclass(frozen=True)
class EngineSpec:
    config: str | None = None            # YAML file of options
    overrides: tuple[str, ...] = ()      # `--set key=value` strings
    data: str | None = None              # dataset path; None = the built-in synthetic catalog
    format: str = "amazon2018"
    category: str | None = None
    kv_dir: str | None = None
    adapter: str | None = None           # `--adapter`: the tuned ranker, its scorer and method
    scorer: str | None = None            # None: the adapter's, else the verbalizer
    history_bytes: int = 1 << 30         # memory budget of client-supplied review chunks
    redis_url: str | None = None         # `--redis`: the shared Redis tier below memory/disk
    kv_encoding: str = "raw"             # raw | int8, for the disk and Redis tiers

    def _args(self) -> SimpleNamespace:
        return SimpleNamespace(config=self.config, overrides=list(self.overrides),
                               data=self.data, format=self.format, category=self.category,
                               kv_dir=self.kv_dir)

    def dataset(self) -> Dataset:
        from ..launch import load_data

        return load_data(self._args())

    def engine_config(self):
        """(config, scorer) with the adapter adopted (prompt settings, default method)."""
        from ..launch import engine_config
        from ..launch import adopt_adapter, chosen_options

        adopted = adopt_adapter(engine_config(self._args()), self.adapter, self.scorer,
                                chosen_options(self.config, self.overrides))
        return adopted.cfg, adopted.scorer

    def build(self):
        """(engine, dataset): the engine serves a private, mutable copy of the catalog, on a
        store whose review chunks have their own budget (`history_bytes`), so client reviews
        cannot evict catalog item KV; `kv_dir` adds the disk tier, `redis_url` the Redis tier."""
        from dataclasses import replace

        from ..launch import make_stored_engine

        cfg, scorer = self.engine_config()
        ds = self.dataset()
        ds = replace(ds, items=dict(ds.items))
        engine = make_stored_engine(cfg, ds.items, scorer, self.kv_dir,
                                    history_bytes=self.history_bytes, redis_url=self.redis_url,
                                    encoding=self.kv_encoding)
        return engine, ds
