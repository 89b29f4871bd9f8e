"""The fast-path choice (`finetune.choice`): the paths scored with what they share computed
once (`choicepaths.SharedPaths`) equal the Diagnoser's; sequential elimination drops only paths
that cannot keep the ranking, and names the path the exhaustive choice names."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace as NS

import numpy as np
import pytest

from rcllm.eval.protocol import build_cases, split_users
from rcllm.finetune.choice import choose_fast_path
from rcllm.finetune.choicepaths import SharedPaths
from rcllm.finetune.diagnose import Diagnoser
from rcllm.model.loading import load_model


def test_shared_passes_score_as_the_separate_ones(tiny_pointwise, fav_dataset):
    cases = build_cases(fav_dataset, history_window=2, num_negatives=5)[:5]
    args = (*tiny_pointwise, 2, (3, 2, 1), (0.15, 0.5))   # late@3 = L: naive, no tail
    old, new = Diagnoser(*args), SharedPaths(*args, cache_bytes=2**30)
    names = ["full", "fast", "late@3", "late@2", "late@1", "overlap@0.15", "overlap@0.5"]
    for case in cases:
        a = old.score_case(case, None, only=names)
        b = new.score_case(case, None, only=names)
        assert set(b) == set(names)
        for p in names:
            np.testing.assert_allclose(b[p], a[p], rtol=1e-4, atol=1e-4, err_msg=p)
        # only what is asked for (and full, the reference)
        assert set(new.score_case(case, None, only=["full", "late@2"])) == {"full", "late@2"}
    # the chunks' passes ran once per distinct chunk: candidates recur (popularity negatives)
    distinct = {c for case in cases for c in case.candidates}
    asked = sum(len(case.candidates) for case in cases)
    assert new.chunks.computed == len(distinct) < asked
    # without memory for them, every request computes its chunks again
    none = SharedPaths(*args, cache_bytes=0)
    for case in cases:
        np.testing.assert_allclose(none.score_case(case, None, only=names)["late@1"],
                                   old.score_case(case, None, only=names)["late@1"],
                                   rtol=1e-4, atol=1e-4)
    assert none.chunks.computed == asked


class Fake:
    """Scores per path as `table[path](case)`; counts what it was asked to score."""

    tail, depths, ratios = 1, (25, 20, 10), (0.15,)
    model = NS(arch=NS(num_layers=30))

    def __init__(self, table):
        self.table, self.asked = table, []

    def score_case(self, case, other, only):
        self.asked.append(tuple(only))
        return {p: self.table[p](case) for p in ["full", *only] if p in self.table}


FULL = np.array([9.0, 8, 7, 6, 5, 0, 0, 0, 0, 0])       # target at index 0
OFF = np.array([0.0, 0, 0, 0, 9, 8, 7, 6, 5, 1])        # target 10th, top-5 overlap 0.2
NEAR = np.array([9.0, 8, 7, 5, 6, 0, 0, 0, 0, 0])       # full's top 5 reordered, same NDCG


def _cases(n=24):
    return [NS(candidates=tuple("abcdefghij"), target="a", user_id=f"u{k % 6}", k=k)
            for k in range(n)]


@pytest.mark.parametrize("table, named, left_out", [
    # the fast paths far from full are dropped (top-5 0.2: out once 0.2·k + (24 − k) < 0.8·24,
    # after 7 requests); late@10 keeps the ranking
    ({"full": lambda c: FULL, "fast": lambda c: OFF, "late@25": lambda c: OFF,
      "late@20": lambda c: OFF, "late@10": lambda c: NEAR, "overlap@0.15": lambda c: OFF},
     "late@10", {"naive": 7, "late@25": 7, "overlap@0.15": 7, "late@20": 7}),
    # a fast path keeps it from the start: the slower ones are left out after the screen (a
    # quarter of the 24 requests)
    ({"full": lambda c: FULL, "fast": lambda c: OFF, "late@25": lambda c: NEAR,
      "late@20": lambda c: FULL, "late@10": lambda c: FULL, "overlap@0.15": lambda c: OFF},
     "late@25", {"naive": 7, "overlap@0.15": 7, "late@20": 6, "late@10": 6}),
    # naive keeps it on the screen only: every path left out is scored after all
    ({"full": lambda c: FULL, "fast": lambda c: OFF if c.k >= 12 else FULL,
      "late@25": lambda c: NEAR, "late@20": lambda c: OFF, "late@10": lambda c: FULL,
      "overlap@0.15": lambda c: OFF if c.k % 2 else NEAR}, "late@25", {}),
    # none keeps it: the dropped paths are scored to the end, for the closest
    ({"full": lambda c: FULL, "fast": lambda c: OFF, "late@25": lambda c: OFF,
      "late@20": lambda c: OFF, "late@10": lambda c: OFF if c.k % 3 else FULL,
      "overlap@0.15": lambda c: OFF if c.k % 4 else FULL}, "late@10", {}),
])
def test_sequential_choice_names_what_the_exhaustive_one_names(table, named, left_out):
    from rcllm.finetune.choice import path_name

    cases = _cases()
    every, seq = Fake(table), Fake(table)
    a = choose_fast_path(every, cases)
    b = choose_fast_path(seq, cases, drop=True)
    assert path_name(a) == path_name(b) == named and a["within"] == b["within"]

    def fast_scored(scorer):     # fast paths scored, request by request
        return sum(len([p for p in x if p != "full"]) for x in scorer.asked)

    dropped = b["validation"].get("dropped", {})
    assert {p: d["requests"] for p, d in dropped.items()} == left_out
    assert fast_scored(seq) == fast_scored(every) - sum(24 - k for k in left_out.values())
    for p, v in b["validation"]["ndcg10"].items():
        if p not in dropped:      # scored on every request: the same numbers
            assert v == a["validation"]["ndcg10"][p]
            assert b["validation"]["top5"][p] == a["validation"]["top5"][p]
    if not left_out:
        assert a["validation"] == b["validation"]


def _learnt_adapter(tiny_ft_config, ds, folder):
    from rcllm.finetune.trainer import Trainer

    cfg = tiny_ft_config(lr=1e-2, steps=12, val_users=6, val_every=4, val_candidates=6,
                         reuse_select="overlap", choice_targets=4)
    train_users, val_users, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    Trainer(load_model(cfg.model), ds, train_users, cfg, folder, "k", val_users).run(False)
    return cfg


def test_the_adapters_choice_is_the_same_either_way(tiny_ft_config, fav_dataset, tmp_path,
                                                    capsys):
    """On a trained tiny adapter, `train.choice=sequential` (the default) and `exhaustive`
    write the same manifest answer."""
    import dataclasses

    from rcllm.finetune.choice import choose_for_adapter

    cfg = _learnt_adapter(tiny_ft_config, fav_dataset, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    got = {}
    for name, how in (("a", "exhaustive"), ("b", "sequential")):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, choice=how))
        choose_for_adapter(c, tmp_path / name, fav_dataset)
        assert f"fast-path choice ({how}, " in capsys.readouterr().out
        got[how] = json.loads((tmp_path / name / "adapter.json").read_text())["fast_path"]
    a, b = got["exhaustive"], got["sequential"]
    keep = ("validation",)
    assert {k: v for k, v in a.items() if k not in keep} == {
        k: v for k, v in b.items() if k not in keep}
    dropped = b["validation"].get("dropped", {})
    for p, v in a["validation"]["ndcg10"].items():
        if p not in dropped:
            assert b["validation"]["ndcg10"][p] == pytest.approx(v, abs=1e-3)
    assert a["validation"]["requests"] == b["validation"]["requests"] == 12   # 3 users × 4

