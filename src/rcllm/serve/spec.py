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

    def _args(self) -> SimpleNamespace:
        return SimpleNamespace(config=self.config, overrides=list(self.overrides),
                               data=self.data, format=self.format, category=self.category,
                               kv_dir=self.kv_dir)

    def dataset(self) -> Dataset:
        from ..commands.common import load_data

        return load_data(self._args())

    def build(self):
        """(engine, dataset): the engine serves a private, mutable copy of the catalog."""
        from dataclasses import replace

        from ..commands.common import make_engine

        ds = self.dataset()
        ds = replace(ds, items=dict(ds.items))
        return make_engine(self._args(), ds), ds
