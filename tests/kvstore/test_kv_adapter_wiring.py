"""`--adapter` on rank and serve adopts the tuned ranker whole (adapter, prompt settings,
scorer, default method); `finetune --fresh --out DIR` deletes only what finetune wrote."""

import dataclasses
import json

import pytest
from kv_helpers import write_adapter

from rcllm.cli import main
from rcllm.commands.finetune import check_discardable, discard_run
from rcllm.config import ModelConfig, RcllmConfig
from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases
from rcllm.commands.common import DEFAULT_SYNTHETIC
from rcllm.model.loading import load_model
from rcllm.serve.spec import EngineSpec


@pytest.fixture
def tuned(tiny_model_dir, tmp_path):
    base = load_model(ModelConfig(path=str(tiny_model_dir), threads=0))
    return write_adapter(tmp_path / "tuned", base, tiny_model_dir,
                         train={"objective": "pointwise", "path": "joint"},
                         fast_path={"method": "naive", "item_tail": 0, "user_side": "exact"})


def test_serve_spec_adopts_the_adapters_scorer_and_method(tiny_model_dir, tuned):
    sets = (f"model.path={tiny_model_dir}", "model.threads=0")
    cfg, scorer = EngineSpec(overrides=sets, adapter=str(tuned)).engine_config()
    assert cfg.model.adapter == str(tuned) and scorer == "pointwise"
    assert cfg.reuse.method == "naive"            # a reuse-aware adapter's method
    assert cfg.reuse.user_side == "behind"        # and its user side cached exactly
    # explicit choices win
    cfg, scorer = EngineSpec(overrides=sets + ("reuse.method=rcllm",), adapter=str(tuned),
                             scorer="verbalizer").engine_config()
    assert cfg.reuse.method == "rcllm" and scorer == "verbalizer"
    plain_cfg, plain_scorer = EngineSpec(overrides=sets).engine_config()
    assert plain_cfg.model.adapter == "" and plain_scorer == "verbalizer"
    engine, _ = EngineSpec(overrides=sets, adapter=str(tuned)).build()
    assert engine.scorer == "pointwise" and engine.cfg.reuse.method == "naive"
    assert engine.cfg.reuse.user_side == "behind"
    with pytest.raises(RcllmError, match="adapter not found"):
        EngineSpec(overrides=sets, adapter=str(tuned / "missing")).engine_config()


def test_rank_with_adapter_uses_its_method(tiny_model_dir, tuned, tmp_path, capsys):
    ds = load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)
    case = build_cases(ds, history_window=3, num_negatives=3, seed=0, max_cases=1)[0]
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"user_id": case.user_id, "candidates": list(case.candidates),
                               "history": [dataclasses.asdict(h) for h in case.history]}))
    rc = main(["rank", "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0",
               "--no-kv-dir", "--request", str(req), "--adapter", str(tuned)])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("method naive")
    assert RcllmConfig().reuse.method != "naive"  # so the adapter is what chose it


def test_fresh_refuses_a_folder_that_is_not_an_adapter_folder(tmp_path, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    with pytest.raises(RcllmError, match="not an rcllm adapter or checkpoint folder"):
        check_discardable(home)
    rc = main(["finetune", "--fresh", "--out", str(home)])
    assert rc == 2 and "refusing to delete" in capsys.readouterr().err
    assert (home / "thesis.tex").read_text() == "years of work"
    check_discardable(tmp_path / "new")           # absent or empty folders are fine
    (tmp_path / "empty").mkdir()
    check_discardable(tmp_path / "empty")


def test_fresh_removes_only_what_finetune_wrote(tiny_model_dir, tuned):
    (tuned / "notes.txt").write_text("keep me")
    (tuned / "checkpoint").mkdir()
    (tuned / "checkpoint" / "state.json").write_text(json.dumps({"key": "k", "step": 3}))
    (tuned / "checkpoint" / "state.safetensors").write_bytes(b"x")
    discard_run(tuned)
    assert sorted(p.name for p in tuned.iterdir()) == ["notes.txt"]
    (tuned / "notes.txt").unlink()
    write_adapter(tuned, load_model(ModelConfig(path=str(tiny_model_dir), threads=0)),
                  tiny_model_dir)
    discard_run(tuned)
    assert not tuned.exists()                     # nothing else in it: the folder goes too
