"""The end-of-run fast-path choice: which fast path the adapter names (docs/finetune.md).

After training, `choose_for_adapter` scores the candidate fast paths — naive with the trained
item tail, `late@s` for `CHOICE_DEPTHS`, `overlap@r` for `CHOICE_RATIOS` (`tried`) — on the
validation users' last `train.choice_targets` requests each, and names in the manifest
(`fast_path`, via `adapter.record_fast_path`) the fastest that keeps the full path's ranking:
mean NDCG@10 within `tolerance` of full's, the lower end of the paired 95% interval (resampled
by user) at or above `floor`, top-5 agreement with full at or above `top5`; or, when none keeps
it, the closest by mean NDCG@10, marked `"within": false` (`choose_fast_path`). "Fastest" is
the share of the item tokens' layer work a path computes in the prompt (`computed_share`).

Trigger: a pointwise adapter with a fast path whose choice is missing or was made on another
`choice_targets`; the path it was trained for stays under `trained_fast_path`. Before it, the
run is checked for having learnt anything (`learnt`): an adapter that learnt nothing is marked
so in the manifest, names no fast path, and the choice is skipped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..eval import metrics as M

CHOICE_DEPTHS = (28, 25, 20, 15, 10, 5)  # late@s tried
CHOICE_RATIOS = (0.15, 0.3)               # overlap@r tried


def computed_share(path: str, layers: int) -> float:
    """The share of the item tokens' layer work a fast path computes in the prompt: the
    order `choose_fast_path` tries them in (fastest first)."""
    if path.startswith("late@"):
        return (layers - int(path.split("@")[1])) / layers
    if path.startswith("overlap@"):
        return float(path.split("@")[1])
    return 0.0


def path_setting(path: str, fill: str = "order") -> dict:
    """The reuse settings of a diagnostic fast path's name (the manifest's `fast_path`);
    `fill`: the overlap paths' `reuse.overlap_fill`."""
    if path.startswith("late@"):
        return {"method": "late", "late_layer": int(path.split("@")[1])}
    if path.startswith("overlap@"):
        r = float(path.split("@")[1])
        return {"method": "rcllm", "rcllm_select": "overlap", "item_ratio": r,
                "history_ratio": r, **({"overlap_fill": fill} if fill != "order" else {})}
    return {"method": "naive"}


def path_name(setting: dict) -> str:
    """The diagnostic name of a `fast_path` setting (naive, late@s, overlap@r)."""
    if setting["method"] == "late":
        return f"late@{setting['late_layer']}"
    if setting["method"] == "rcllm":
        return f"{setting.get('rcllm_select', 'blend')}@{float(setting['item_ratio']):g}"
    return setting["method"]


def tried(fast: dict, layers: int) -> tuple[tuple[int, ...], list[float]]:
    """The late depths and overlap ratios the choice tries for an adapter trained for `fast`
    on a model of `layers` layers: `CHOICE_DEPTHS` within the model (its last three layers on a
    shallower one) and `CHOICE_RATIOS`, each with the trained path's own depth or ratio."""
    depths = (tuple(s for s in CHOICE_DEPTHS if 0 < s < layers)
              or tuple(range(layers - 1, 0, -1))[:3])
    if fast.get("method") == "late" and int(fast["late_layer"]) not in depths:
        depths = tuple(sorted({*depths, int(fast["late_layer"])}, reverse=True))
    ratios = sorted({*CHOICE_RATIOS, *([float(fast["item_ratio"])]
                                       if fast.get("rcllm_select") == "overlap" else [])})
    return depths, ratios


def choose_fast_path(scorer, cases, tolerance: float = 0.02,
                     progress: bool = False, floor: float = -0.05, top5: float = 0.8) -> dict:
    """The fastest fast path that keeps the full path's ranking over `cases` (validation
    users' requests), by the rule of the module docstring. Tried: naive with the scorer's item
    tail, late@s for `scorer.depths` and overlap@r for `scorer.ratios` (a `diagnose.Diagnoser`),
    every path on every case. The manifest's `fast_path`."""
    from tqdm import tqdm

    names = (["full", "fast"] + [f"late@{s}" for s in scorer.depths]
             + [f"overlap@{r:g}" for r in scorer.ratios])
    nd = {p: [] for p in names}
    agree = {p: [] for p in names}
    for case in tqdm(cases, desc="fast paths", unit="request", disable=not progress):
        got = scorer.score_case(case, None, only=names)
        t = list(case.candidates).index(case.target)
        for p, sc in got.items():
            nd[p].append(M.ndcg(sc, t, 10))
            agree[p].append(M.topk_overlap(got["full"], sc, 5))
    users = [c.user_id for c in cases]
    mean = {p: float(np.mean(v)) for p, v in nd.items()}
    low = {p: M.cluster_bootstrap_ci(np.array(nd[p]) - np.array(nd["full"]), users).low
           for p in names}
    top = {p: float(np.mean(v)) for p, v in agree.items()}
    L = scorer.model.arch.num_layers
    order = sorted(names[1:], key=lambda p: computed_share(p, L))
    within = [p for p in order if mean[p] >= mean["full"] - tolerance
              and low[p] >= floor and top[p] >= top5]
    pick = within[0] if within else max(order, key=lambda p: mean[p])

    def named(table):
        return {("naive" if p == "fast" else p): round(v, 4) for p, v in table.items()}

    return {**path_setting(pick, getattr(scorer, "fill", "order")), "item_tail": scorer.tail,
            "user_side": "exact", "within": bool(within),
            "validation": {"users": len(set(users)), "requests": len(cases),
                           "tolerance": tolerance, "floor": floor, "top5_floor": top5,
                           "ndcg10": named(mean), "delta_low": named(low), "top5": named(top)}}


def _due(manifest: dict, t) -> bool:
    """True when the adapter's fast path is to be chosen: a pointwise adapter with a fast path
    whose choice is missing or was made on another `train.choice_targets`."""
    fast = manifest.get("fast_path")
    return bool(fast) and t.objective == "pointwise" and (
        fast.get("validation", {}).get("targets_per_user") != t.choice_targets)


def choose_for_adapter(cfg, folder: Path, ds, val_users) -> None:
    """Names in the manifest the fastest fast path that keeps the full path's ranking on the
    validation users' last `train.choice_targets` requests each (`choose_fast_path`), once: a
    finished adapter without it, or chosen with another count, gets it when the same command
    runs again. Prints what it chose."""
    from ..eval.protocol import earlier_cases
    from .adapter import read_manifest, record_fast_path
    from .validate import EVAL_HISTORY_WINDOW, validation_cases

    if not _learnt(folder):
        return
    manifest = read_manifest(folder)
    t = cfg.train
    if not _due(manifest, t):
        return
    fast = manifest["fast_path"]
    cases = earlier_cases(ds, validation_cases(ds, val_users, t.val_candidates, t.val_users),
                          t.choice_targets - 1, EVAL_HISTORY_WINDOW)
    if not cases:
        return
    if "validation" in fast:   # chosen by an earlier rule: chosen again, the path trained kept
        was = fast["validation"].get("requests", fast["validation"].get("users", "?"))
        fast = manifest.get("trained_fast_path") or fast
        print(f"choosing the fast path again on {t.choice_targets} requests per validation "
              f"user (it was chosen on {was} requests)")
    chosen = choose_fast_path(_diagnoser(cfg, folder, ds, fast), cases, progress=True)
    chosen["validation"]["targets_per_user"] = t.choice_targets
    record_fast_path(folder, chosen)
    print(_said(chosen, len(cases)))


def _learnt(folder: Path) -> bool:
    """False when the adapter learnt nothing (`learnt.learnt_check`, recorded in the manifest
    the first time): then it says so, and no fast path is chosen."""
    from .adapter import read_manifest, record_learnt
    from .learnt import learnt_check

    manifest = read_manifest(folder)
    check = manifest.get("learnt_check")
    if check is None:
        check = learnt_check(manifest.get("best", {}),
                             manifest.get("train", {}).get("val_candidates"))
        record_learnt(folder, check)
    if check["learnt"] is False:
        print(f"the adapter learnt nothing: {check['reason']}. No fast path is chosen for it "
              "and its rankings are the untuned model's (manifest: \"learnt\": false)")
    elif check["learnt"]:
        print(f"learnt: {check['reason']}")
    return check["learnt"] is not False


def _diagnoser(cfg, folder: Path, ds, fast: dict):
    """The adapter loaded (merged) and its diagnoser over the paths `tried` for `fast`."""
    from ..model.loading import load_model
    from ..prompt.builder import PromptBuilder
    from ..prompt.pointwise import PointwisePrompt
    from .diagnose import Diagnoser

    loaded = load_model(dataclasses.replace(cfg.model, adapter=str(folder)))
    builder = PromptBuilder(loaded.tokenizer, ds.items, cfg.prompt,
                            loaded.model.arch.max_positions, "verbalizer")
    pw = PointwisePrompt(builder, loaded.model.arch.max_positions)
    depths, ratios = tried(fast, loaded.model.arch.num_layers)
    return Diagnoser(loaded.model, pw, int(fast["item_tail"]), depths, ratios,
                     fast.get("overlap_fill", "order"))


def _said(chosen: dict, requests: int) -> str:
    """The line that tells what the choice found and named."""
    v, top5 = chosen["validation"]["ndcg10"], chosen["validation"]["top5"]
    return (f"fast-path choice on {requests} requests of {chosen['validation']['users']} "
            "validation users (NDCG@10, top-5 agreement): "
            + ", ".join(f"{k} {x:.3f} {top5[k]:.2f}" for k, x in v.items())
            + f"; the adapter serves {path_name(chosen)}"
            + ("" if chosen["within"] else " (the closest: none keeps the full path's ranking: "
                                           "within 0.02, lower end >= -0.05, top-5 >= 0.8)"))
