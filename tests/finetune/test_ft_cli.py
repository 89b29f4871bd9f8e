"""`rcllm finetune` and `rcllm eval --adapter` end to end on the tiny model; input errors."""

from __future__ import annotations

import json

import pytest

from rcllm.cli import main

TINY_TRAIN = ["--set", "train.steps=3", "--set", "train.batch=2", "--set", "train.candidates=5",
              "--set", "train.val_users=3", "--set", "train.val_candidates=5", "--set",
              "prompt.history_window=2", "--set", "prompt.max_item_tokens=8", "--set",
              "prompt.max_review_tokens=8", "--set", "lora.rank=2", "--set",
              "train.max_examples=5", "--set", "lora.first_layer=1"]

LEARNS = [*TINY_TRAIN, "--set", "train.lr=1e-2"]   # with fav_dataset: learnt in 3 steps


def _model(tiny_model_dir, tmp_path):
    return ["--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0",
            "--set", f"model.cache_dir={tmp_path / 'cache'}"]


def test_finetune_then_eval_with_adapter(tiny_model_dir, tmp_path, capsys, monkeypatch,
                                        fav_dataset):
    # users whose last item is always the same one, at a rate that learns it in 3 steps: the
    # run learns (finetune.learnt), so the fast path is chosen (test_ft_learnt: when it is not)
    monkeypatch.setattr("rcllm.commands.common.load_data", lambda args: fav_dataset)
    rc = main(["finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path),
               *LEARNS])
    assert rc == 0
    out = capsys.readouterr().out
    assert "learnt: validation cross-entropy" in out
    folders = list((tmp_path / "cache" / "adapters").iterdir())
    assert len(folders) == 1 and (folders[0] / "adapter.json").exists()
    # the curves are printed, and saved next to the adapter with the chance line
    assert "validation (chance ln C = 1.609" in out and "prompts/s" in out
    assert "5 training examples (of " in out and "train.max_examples=5 keeps" in out
    assert (folders[0] / "curves.json").exists() and (folders[0] / "curves.png").exists()
    curves = json.loads((folders[0] / "curves.json").read_text())
    # the manifest names the fast path validated on the validation users: naive or late@s,
    # the fastest within 0.02 NDCG@10 of full (else the closest, marked so)
    manifest = json.loads((folders[0] / "adapter.json").read_text())
    fast = manifest["fast_path"]
    # the default recipe trains the fast path rcllm's overlap selection serves
    trained = manifest["trained_fast_path"]
    assert (trained["method"], trained["rcllm_select"], trained["item_ratio"]) == (
        "rcllm", "overlap", 0.15)
    assert fast["method"] in ("naive", "late", "rcllm") and "fast paths on" not in out
    assert set(fast["validation"]["ndcg10"]) == {"full", "naive", "late@2", "late@1",
                                                 "overlap@0.15", "overlap@0.3"}
    assert "the adapter serves" in out
    # chosen on each validation user's last train.choice_targets requests (default 4)
    v = fast["validation"]
    assert v["targets_per_user"] == 4 and v["users"] <= v["requests"] <= 4 * v["users"]
    assert set(v["top5"]) == set(v["delta_low"]) == set(v["ndcg10"])
    # 3 steps an epoch: validation four times an epoch is every step
    assert [r["step"] for r in curves["validation"]] == [0, 1, 2, 3]
    assert {"ce_full", "ce_reuse", "kl"} <= set(curves["train"][0])
    # the same command again finds the finished adapter in its cache folder
    assert main(["finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path),
                 *LEARNS]) == 0
    assert "already trained" in capsys.readouterr().out
    # another choice_targets changes no weights: the same adapter, its fast path chosen again
    assert main(["finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path),
                 *LEARNS, "--set", "train.choice_targets=1"]) == 0
    out = capsys.readouterr().out
    assert "choosing the fast path again on 1 requests per validation user" in out
    again = json.loads((folders[0] / "adapter.json").read_text())
    assert again["fast_path"]["validation"]["requests"] == v["users"]
    assert again["trained_fast_path"] == trained and again["sha256"] == manifest["sha256"]
    report = tmp_path / "eval.json"
    rc = main(["eval", "--format", "synthetic", "--set", f"model.path={tiny_model_dir}",
               "--set", "model.threads=0", "--adapter", str(folders[0]), "--users", "test",
               "--baselines", "--methods", "full,rcllm", "--requests", "3", "--candidates", "5",
               "--json", str(report)])
    assert rc == 0
    data = json.loads(report.read_text())
    variants = [r["variant"] for r in data["rows"]]
    assert {"full", "full_reordered", "random", "popularity", "item_knn"} <= set(variants)
    assert data["config"]["engine"]["prompt"]["history_window"] == 2  # adopted from the adapter
    assert data["config"]["engine"]["model"]["adapter"] == str(folders[0])
    # the default objective is pointwise: eval ranks with the pointwise scorer, whose scores
    # cannot depend on the candidate order
    assert data["config"]["scorer"] == "pointwise"
    rows = {r["variant"]: r for r in data["rows"]}
    assert rows["full_reordered"]["top1_agreement"] == 1.0
    for row in data["rows"]:
        assert row["hr@10_ci_low"] <= row["hr@10"] <= row["hr@10_ci_high"]
    # the diagnostics on the same adapter: every path, the late-joint curve as a picture
    diag, png = tmp_path / "diag.json", tmp_path / "late.png"
    rc = main(["diagnose", "--format", "synthetic", "--set", f"model.path={tiny_model_dir}",
               "--set", "model.threads=0", "--adapter", str(folders[0]), "--requests", "3",
               "--candidates", "5", "--depths", "0,1,2", "--ratios", "0.5", "--json", str(diag),
               "--plot", str(png)])
    assert rc == 0 and png.exists()
    rows = {r["path"]: r for r in json.loads(diag.read_text())["rows"]}
    assert {"full", "fast", "late@0", "late@1", "late@2", "overlap@0.5", "foreign", "short",
            "full_user_swapped", "fast_user_swapped"} == set(rows)
    assert rows["late@0"]["delta_vs_full"] == 0.0
    # bad input is refused before the model loads
    assert main(["diagnose", "--adapter", str(tmp_path), "--depths", "a"]) == 2
    assert main(["diagnose", "--adapter", str(tmp_path), "--ratios", "1.5"]) == 2
    assert main(["diagnose", "--adapter", str(tmp_path / "none")]) == 2


@pytest.mark.parametrize("args, message", [
    (["--set", "train.batch=0"], "train.batch"),
    (["--set", "train.path=both"], "train.path"),
    (["--set", "lora.targets=q,z"], "lora.targets"),
    (["--set", "train.targets=first"], "train.targets"),
    (["--set", "train.split=0.5,0.5"], "train.split"),
    (["--set", "train.max_examples=-1"], "max_examples"),
    (["--set", "lora.first_layer=99"], "first_layer"),
    (["--set", "model.adapter=/x"], "stacking adapters"),
])
def test_bad_options_are_one_clear_line(tiny_model_dir, tmp_path, capsys, args, message):
    rc = main(["finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("rcllm: error:") and message in err[0]


def test_eval_with_missing_adapter_is_one_clear_line(tmp_path, capsys):
    rc = main(["eval", "--format", "synthetic", "--adapter", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "adapter not found" in err[0]


def test_help_shows_this_commands_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["finetune", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "prompt.history_window = 5" in out and "lora.rank" in out


def test_recipe_chains_its_stages_and_finds_them_again(tiny_model_dir, tmp_path, capsys,
                                                      monkeypatch):
    from rcllm.commands import finetune as cmd
    from rcllm.finetune.adapter import read_manifest

    stages = (("standard", ("train.steps=3", "train.path=full")),
              ("tail", ("train.path=reuse", "train.reuse_tail=1", "train.steps=2",
                        "train.lr=5e-4")))
    monkeypatch.setitem(cmd.RECIPES, "item-tail", stages)
    common = ["finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path),
              *TINY_TRAIN[2:], "--recipe", "item-tail"]   # TINY_TRAIN[:2] sets train.steps
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "stage 1/2: standard" in out and "stage 2/2: tail" in out
    folders = sorted((tmp_path / "cache" / "adapters").iterdir())
    assert len(folders) == 2
    manifests = {f.name: read_manifest(f) for f in folders}
    tail = next(m for m in manifests.values() if m["train"]["path"] == "reuse")
    first = next(m for m in manifests.values() if not m["train"]["path"] == "reuse")
    # the second stage starts from the first one's factors and says so by checksum
    assert tail["train"]["init_sha256"] == first["sha256"]
    assert tail["train"]["steps"] == 2 and tail["train"]["reuse_tail"] == 1
    assert first["train"]["steps"] == 3 and first["train"]["init_sha256"] is None
    # the same command again finds both stages instead of retraining them
    assert main(common) == 0
    assert capsys.readouterr().out.count("already trained") == 2
    # a finished adapter given as the first stage: the later stages start from it
    first_dir = next(f for f in folders if not manifests[f.name]["train"]["path"] == "reuse")
    assert main([*common, "--set", f"train.init={first_dir}"]) == 0
    out = capsys.readouterr().out
    assert f"given by train.init: {first_dir}" in out and out.count("already trained") == 1


@pytest.mark.parametrize("extra, message", [
    (["--set", "train.lr=1e-3"], "train.lr"),
    (["--set", "train.init=/x"], "not a finished adapter"),
    (["--fresh"], "--fresh"),
    (["--config", "STEPS.yaml"], "sets train.steps"),
])
def test_recipe_refuses_what_its_stages_set(tiny_model_dir, tmp_path, capsys, extra, message):
    (tmp_path / "STEPS.yaml").write_text("train:\n  steps: 5\n")
    extra = [str(tmp_path / e) if e.endswith(".yaml") else e for e in extra]
    rc = main(["finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path),
               "--recipe", "item-tail", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]


def test_bench_finetune_prints_each_variant_against_the_first(tiny_model_dir, tmp_path, capsys):
    small = [x for x in TINY_TRAIN if x != "lora.first_layer=1"][:-1]  # every option but that
    out_json = tmp_path / "tp.json"
    rc = main(["bench", "finetune", "--format", "synthetic", *_model(tiny_model_dir, tmp_path),
               *small, "--variants", "1:0,1:2:whole,1:2", "--prompts", "2",
               "--json", str(out_json)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| 1 thread, LoRA from layer 0 |" in out and "| 1 thread, LoRA from layer 2 |" in out
    assert "| 1 thread, LoRA from layer 2, chunk pass whole |" in out
    report = json.loads(out_json.read_text())
    assert report["name"] == "bench_finetune"
    rows = report["rows"]
    assert [(r["first_layer"], r["cached"], r["item_cache"]) for r in rows] == [
        (0, False, True), (2, True, False), (2, True, True)]
    assert all(r["first_per_s"] > 0 and r["again_per_s"] > 0 for r in rows)
    assert rows[0]["again_per_s"] == rows[0]["first_per_s"]  # nothing to reuse from layer 0
    # only the variant that keeps item states (below a frozen layer) warms the timed items
    assert rows[0]["items_held"] == rows[1]["items_held"] == 0 < rows[2]["items_held"]
    assert 0 < rows[2]["epoch_item_share"] < 1
    for bad in ("2-20", "2:20:x", "2:20:whole:1"):
        assert main(["bench", "finetune", "--variants", bad]) == 2  # refused before loading
