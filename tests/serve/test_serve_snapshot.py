"""An instance saves what its stores hold and puts it back (`bench serve --sweep
--cell-reset`): later builds and evictions undone, the held index (the router's picture of the
instance) following; refused where a tier lies outside the process."""

from __future__ import annotations

import dataclasses

import pytest

from rcllm.config import ModelConfig, RcllmConfig
from rcllm.errors import RcllmError
from rcllm.launch import make_stored_engine
from rcllm.serve.host import EngineHost


def _host(tiny_model_dir, synthetic, **engine) -> EngineHost:
    cfg = dataclasses.replace(RcllmConfig(), model=ModelConfig(path=str(tiny_model_dir),
                                                               threads=0))
    return EngineHost(make_stored_engine(cfg, dict(synthetic.items), **engine))


def test_the_store_is_put_back_as_it_was_saved(tiny_model_dir, synthetic, tmp_path):
    host = _host(tiny_model_dir, synthetic)
    items = sorted(synthetic.items)
    with pytest.raises(RcllmError, match="keep_snapshot"):
        host.restore_snapshot()
    host.build_items(items[:3])
    assert host.keep_snapshot() == 3
    saved = set(host.cached_items())
    host.build_items(items[3:6])
    assert set(host.cached_items()) == saved | set(items[3:6])
    assert set(host.restore_snapshot()) == saved == set(host.cached_items())
    assert set(host.scan_cached_items()) == saved         # the index agrees with the store
    assert host.lost_items() is None                       # nothing left to report
    on_disk = _host(tiny_model_dir, synthetic, kv_dir=str(tmp_path / "kv"))
    with pytest.raises(RcllmError, match="process memory only"):
        on_disk.keep_snapshot()
