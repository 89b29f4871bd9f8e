"""The saved adapter: fingerprint, cache-key isolation, checksum and base-model checks."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rcllm.config import RcllmConfig
from rcllm.errors import RcllmError
from rcllm.eval.protocol import split_users
from rcllm.finetune.adapter import eval_settings, trained_scorer
from rcllm.finetune.trainer import Trainer
from rcllm.model.loading import load_model


@pytest.fixture
def adapter(tiny_ft_config, fav_dataset, tmp_path):
    cfg = tiny_ft_config(steps=4)
    users = split_users(fav_dataset, cfg.train.fractions, cfg.train.split_seed)[0]
    folder = tmp_path / "adapter"
    Trainer(load_model(cfg.model), fav_dataset, users, cfg, folder, "k").run(progress=False)
    return cfg, folder


def test_fingerprint_covers_the_adapter(adapter, fav_dataset):
    from rcllm.engine import Engine

    cfg, folder = adapter
    base = load_model(cfg.model)
    tuned = load_model(dataclasses.replace(cfg.model, adapter=str(folder)))
    again = load_model(dataclasses.replace(cfg.model, adapter=str(folder / "adapter.json")))
    assert tuned.fingerprint != base.fingerprint
    assert tuned.fingerprint == again.fingerprint  # deterministic, whichever path names it
    engines = [Engine(m, fav_dataset.items, RcllmConfig()) for m in (base, tuned)]
    ids = engines[0].builder.item_chunk(sorted(fav_dataset.items)[0])
    keys = [e.chunk_key("item", ids) for e in engines]
    assert keys[0] != keys[1]  # KV built under one adapter is never found under another


def test_checksum_mismatch_is_refused(adapter):
    cfg, folder = adapter
    weights = folder / "adapter.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(RcllmError, match="checksum mismatch"):
        load_model(dataclasses.replace(cfg.model, adapter=str(folder)))


def test_adapter_of_another_model_is_refused(adapter):
    cfg, folder = adapter
    manifest = json.loads((folder / "adapter.json").read_text())
    manifest["base_fingerprint"] = "0" * 32
    (folder / "adapter.json").write_text(json.dumps(manifest))
    with pytest.raises(RcllmError, match="trained on another model"):
        load_model(dataclasses.replace(cfg.model, adapter=str(folder)))


def test_missing_adapter_is_refused(tmp_path, tiny_ft_config):
    cfg = tiny_ft_config()
    with pytest.raises(RcllmError, match="adapter not found"):
        load_model(dataclasses.replace(cfg.model, adapter=str(tmp_path / "nope")))


def test_eval_adopts_the_adapter_prompt(adapter):
    cfg, folder = adapter
    got, fractions, seed = eval_settings(RcllmConfig(), folder)
    assert got.prompt == cfg.prompt and got.model.adapter == str(folder)
    assert fractions == (0.8, 0.1, 0.1) and seed == 0
    # the default (joint) adapter is served on the fast path it was trained for
    assert got.reuse.item_tail == 1 and got.reuse.user_side == "behind"


def test_adapter_of_another_prompt_version_is_refused(adapter):
    """An adapter records the prompt version it was trained on; loading or evaluating it under
    another is refused with a message that says what to do."""
    from rcllm.prompt.builder import PROMPT_VERSION

    cfg, folder = adapter
    manifest = json.loads((folder / "adapter.json").read_text())
    assert manifest["prompt_version"] == PROMPT_VERSION
    manifest.pop("prompt_version")  # an adapter from before the field: version 1
    (folder / "adapter.json").write_text(json.dumps(manifest))
    with pytest.raises(RcllmError, match="prompt version 1.*rcllm finetune"):
        load_model(dataclasses.replace(cfg.model, adapter=str(folder)))
    with pytest.raises(RcllmError, match="prompt version 1"):
        eval_settings(RcllmConfig(), folder)


def test_eval_adopts_the_trained_item_tail(tiny_ft_config, fav_dataset, tmp_path):
    """An adapter trained for the fast path with item tail k (the manifest's fast_path) is
    served with reuse.item_tail = k, naive reuse and its user side cached exactly
    (launch.adopt_adapter); a full-path adapter keeps rcllm and no tail."""
    from rcllm.launch import adopt_adapter
    from rcllm.finetune.adapter import read_manifest, trained_method

    full = tiny_ft_config(steps=2, path="full")
    users = split_users(fav_dataset, full.train.fractions, full.train.split_seed)[0]
    Trainer(load_model(full.model), fav_dataset, users, full, tmp_path / "full", "k").run(
        progress=False)
    assert read_manifest(tmp_path / "full")["fast_path"] is None
    assert trained_method(tmp_path / "full") == "rcllm"
    got = eval_settings(RcllmConfig(), tmp_path / "full")[0]
    assert got.reuse.item_tail == 0 and got.reuse.user_side == "reuse"
    cfg = tiny_ft_config(steps=2, reuse_tail=2)
    users = split_users(fav_dataset, cfg.train.fractions, cfg.train.split_seed)[0]
    folder = tmp_path / "tail"
    Trainer(load_model(cfg.model), fav_dataset, users, cfg, folder, "k").run(progress=False)
    assert read_manifest(folder)["fast_path"] == {"method": "naive", "item_tail": 2,
                                                  "user_side": "exact"}
    assert eval_settings(RcllmConfig(), folder)[0].reuse.item_tail == 2
    adopted = adopt_adapter(RcllmConfig(), str(folder), None)
    assert (adopted.cfg.reuse.item_tail, adopted.cfg.reuse.method) == (2, "naive")
    # trained with the user side exact: the user-prefix cache serves it exactly
    assert adopted.cfg.reuse.user_side == "behind"
    chosen = dataclasses.replace(RcllmConfig(), reuse=dataclasses.replace(
        RcllmConfig().reuse, user_side="exact"))
    assert eval_settings(chosen, folder)[0].reuse.user_side == "exact"
    other = dataclasses.replace(RcllmConfig(), prompt=dataclasses.replace(
        RcllmConfig().prompt, history_window=3))
    with pytest.raises(RcllmError, match="prompt settings"):
        eval_settings(other, folder)


def test_an_overlap_fast_path_is_served_with_its_selection_and_ratio(tmp_path):
    """A manifest whose fast path is rcllm's overlap selection at r: eval, rank and serve run
    rcllm with rcllm_select=overlap at r (an explicit ratio or selection wins)."""
    from rcllm.config import PROMPT_VERSION
    from rcllm.finetune.adapter import record_fast_path, trained_method
    from rcllm.finetune.config import default_prompt
    from rcllm.model.adapter_file import FORMAT

    folder = tmp_path / "a"
    folder.mkdir()
    manifest = {"format": FORMAT, "prompt_version": PROMPT_VERSION,
                "prompt": dataclasses.asdict(default_prompt()), "split": {
        "fractions": [0.8, 0.1, 0.1], "seed": 0}, "fast_path": {
        "method": "naive", "item_tail": 1, "user_side": "exact"}}
    (folder / "adapter.json").write_text(json.dumps(manifest))
    record_fast_path(folder, {"method": "rcllm", "rcllm_select": "overlap", "item_ratio": 0.15,
                              "history_ratio": 0.15, "item_tail": 1, "user_side": "exact"})
    assert trained_method(folder) == "rcllm"
    got = eval_settings(RcllmConfig(), folder)[0].reuse
    assert (got.rcllm_select, got.item_ratio, got.history_ratio, got.item_tail) == (
        "overlap", 0.15, 0.15, 1)
    mine = dataclasses.replace(RcllmConfig(), reuse=dataclasses.replace(
        RcllmConfig().reuse, item_ratio=0.5))
    assert eval_settings(mine, folder)[0].reuse.item_ratio == 0.5


def test_an_option_the_user_set_wins_even_at_its_default_value(tmp_path):
    """A manifest naming late@5: --set reuse.late_layer=20 (the default's value) is served at
    20, as any other explicit layer; an option set in the YAML file counts too."""
    from rcllm.config import PROMPT_VERSION
    from rcllm.finetune.adapter import record_fast_path
    from rcllm.finetune.config import default_prompt
    from rcllm.launch import chosen_options
    from rcllm.model.adapter_file import FORMAT

    folder = tmp_path / "a"
    folder.mkdir()
    manifest = {"format": FORMAT, "prompt_version": PROMPT_VERSION,
                "prompt": dataclasses.asdict(default_prompt()), "split": {
        "fractions": [0.8, 0.1, 0.1], "seed": 0}, "fast_path": None}
    (folder / "adapter.json").write_text(json.dumps(manifest))
    record_fast_path(folder, {"method": "late", "late_layer": 5, "item_tail": 1,
                              "user_side": "exact"})
    default = RcllmConfig()
    assert default.reuse.late_layer == 20
    assert eval_settings(default, folder)[0].reuse.late_layer == 5        # adopted
    chosen = chosen_options(None, ["reuse.late_layer=20"])
    got = eval_settings(default, folder, chosen)[0].reuse
    assert got.late_layer == 20 and got.user_side == "behind" and got.item_tail == 1
    yaml_file = tmp_path / "opts.yaml"
    yaml_file.write_text("reuse:\n  user_side: reuse\nreuse.item_tail: 0\n")
    chosen = chosen_options(str(yaml_file), [])
    assert chosen == {"reuse.user_side", "reuse.item_tail"}
    got = eval_settings(default, folder, chosen)[0].reuse
    assert (got.late_layer, got.user_side, got.item_tail) == (5, "reuse", 0)


def test_eval_scorer_follows_the_objective(adapter, tiny_ft_config, fav_dataset, tmp_path):
    _, folder = adapter
    assert trained_scorer(folder) == "pointwise"
    cfg = tiny_ft_config(steps=2, objective="listwise", path="full")
    users = split_users(fav_dataset, cfg.train.fractions, cfg.train.split_seed)[0]
    listwise = tmp_path / "listwise"
    Trainer(load_model(cfg.model), fav_dataset, users, cfg, listwise, "k").run(progress=False)
    assert trained_scorer(listwise) == "verbalizer"
