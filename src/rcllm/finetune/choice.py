"""The end-of-run fast-path choice: which fast path the adapter names (docs/finetune.md).

After training, `choose_for_adapter` scores the candidate fast paths — naive with the trained
item tail, `late@s` for `CHOICE_DEPTHS`, `overlap@r` for `CHOICE_RATIOS` (`tried`) — on the
validation users' last `train.choice_targets` requests each, and names in the manifest
(`fast_path`, via `adapter.record_fast_path`) the fastest that keeps the full path's ranking:
mean NDCG@10 within `tolerance` of full's, the lower end of the paired 95% interval (resampled
by user) at or above `floor`, top-5 agreement with full at or above `top5`; or, when none keeps
it, the closest by mean NDCG@10, marked `"within": false` (`choose_fast_path`). "Fastest" is
the share of the item tokens' layer work a path computes in the prompt (`computed_share`).

`train.choice=sequential` (the default) scores the paths with what they share computed once
(`choicepaths.SharedPaths`) and stops scoring a path that cannot change the answer: one that
can no longer keep the ranking whatever the requests left hold, and, after a screen of the
first quarter of the requests, those slower than the path that kept it there — scored after
all when no path scored on every request keeps it. It names what `exhaustive` (every path in
its own pass on every request, `diagnose.Diagnoser`) names (tests/finetune/test_ft_choice.py).

Trigger: a pointwise adapter with a fast path whose choice is missing or was made on another
`choice_targets`; the path it was trained for stays under `trained_fast_path`. Before it, the
run is checked for having learnt anything (`learnt`): an adapter that learnt nothing is marked
so in the manifest, names no fast path, and the choice is skipped.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np

from ..eval import metrics as M

CHOICE_DEPTHS = (28, 25, 20, 15, 10, 5)  # late@s tried
CHOICE_RATIOS = (0.15, 0.3)               # overlap@r tried
SCREEN = 0.25   # share of the requests every path is scored on before slower ones are left out


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


class Tally:
    """Per path, NDCG@10 and top-5 agreement with full on each request scored (by request
    index), and the paths dropped: those that can no longer keep the ranking whatever the
    requests not yet scored hold (`drop_hopeless`)."""

    def __init__(self, names: list[str], cases):
        self.names, self.cases = names, cases
        self.nd: dict[str, dict[int, float]] = {p: {} for p in names}
        self.agree: dict[str, dict[int, float]] = {p: {} for p in names}
        self.full: dict[int, np.ndarray] = {}        # full's scores per request
        self.dropped: dict[str, dict] = {}

    def active(self) -> list[str]:
        return [p for p in self.names if p not in self.dropped]

    def add(self, i: int, got: dict[str, np.ndarray]) -> None:
        case = self.cases[i]
        t = list(case.candidates).index(case.target)
        full = self.full.setdefault(i, got["full"])
        for p, sc in got.items():
            self.nd[p][i] = M.ndcg(sc, t, 10)
            self.agree[p][i] = M.topk_overlap(full, sc, 5)

    def drop_hopeless(self, tolerance: float, top5: float) -> None:
        """Drops each path that fails the band on every completion of the requests left: each
        such request adds at most 1 to a path's top-5 agreement and to its NDCG@10 over
        full's, so a path whose sums stay below the band with that added cannot reach it.
        Exact: only a path the exhaustive choice would find outside the band is dropped."""
        n = len(self.cases)
        for p in self.active()[1:]:       # never full
            left = n - len(self.nd[p])
            gain = sum(v - self.nd["full"][i] for i, v in self.nd[p].items())
            if sum(self.agree[p].values()) + left < top5 * n - 1e-9:
                why = f"top-5 agreement cannot reach {top5}"
            elif gain + left < -tolerance * n - 1e-9:
                why = f"NDCG@10 cannot come within {tolerance} of full's"
            else:
                continue
            self.dropped[p] = {"requests": len(self.nd[p]), "why": why}

    def defer_slower(self, order: list[str], tolerance: float, floor: float,
                     top5: float) -> None:
        """After a screen of the first requests: the first path in `order` that keeps the
        ranking on them is the likely pick, and the paths slower than it are left out from
        here on. Exact either way: if some path no slower than it keeps the ranking on every
        request, the first such is what the exhaustive choice names (every path before it
        was scored on every request, or dropped as hopeless); if none does, the paths left
        out are scored on the requests they missed before the choice is made."""
        mean, low, top = self.stats()
        likely = [p for p in order if p not in self.dropped
                  and mean[p] >= mean["full"] - tolerance and low[p] >= floor
                  and top[p] >= top5]
        if not likely:
            return
        pick = "naive" if likely[0] == "fast" else likely[0]
        for p in order[order.index(likely[0]) + 1:]:
            if p not in self.dropped:
                self.dropped[p] = {"requests": len(self.nd[p]),
                                   "why": f"slower than {pick}, which kept the ranking on "
                                          "the first requests"}

    def stats(self) -> tuple[dict, dict, dict]:
        """(mean NDCG@10, lower end of the paired interval vs full, top-5 agreement) per path,
        over the requests each was scored on."""
        mean, low, top = {}, {}, {}
        for p in self.names:
            idx = sorted(self.nd[p])
            mean[p] = float(np.mean([self.nd[p][i] for i in idx]))
            low[p] = M.cluster_bootstrap_ci(
                np.array([self.nd[p][i] - self.nd["full"][i] for i in idx]),
                [self.cases[i].user_id for i in idx]).low
            top[p] = float(np.mean([self.agree[p][i] for i in idx]))
        return mean, low, top


def choose_fast_path(scorer, cases, tolerance: float = 0.02, progress: bool = False,
                     floor: float = -0.05, top5: float = 0.8, drop: bool = False) -> dict:
    """The fastest fast path that keeps the full path's ranking over `cases` (validation
    users' requests), by the rule of the module docstring. Tried: naive with the scorer's item
    tail, late@s for `scorer.depths` and overlap@r for `scorer.ratios` (a `diagnose.Diagnoser`
    or `choicepaths.SharedPaths`). `drop`: a path that can no longer keep the ranking is not
    scored on the requests left (`Tally.drop_hopeless`), nor, after the first `SCREEN` of the
    requests, one slower than the path that kept it there (`Tally.defer_slower`); when no path
    scored on every request keeps it, the paths left out are scored on the requests they
    missed after all. Either way the path named is the one scoring every path on every request
    names. The manifest's `fast_path`."""
    from tqdm import tqdm

    names = (["full", "fast"] + [f"late@{s}" for s in scorer.depths]
             + [f"overlap@{r:g}" for r in scorer.ratios])
    L = scorer.model.arch.num_layers
    order = sorted(names[1:], key=lambda p: computed_share(p, L))
    tally = Tally(names, cases)
    screen = math.ceil(SCREEN * len(cases))
    for i in tqdm(range(len(cases)), desc="fast paths", unit="request", disable=not progress):
        tally.add(i, scorer.score_case(cases[i], None, only=tally.active()))
        if drop:
            tally.drop_hopeless(tolerance, top5)
            if i + 1 == screen:
                tally.defer_slower(order, tolerance, floor, top5)
    mean, low, top = tally.stats()

    def keeping() -> list[str]:     # the paths scored on every request that keep the ranking
        return [p for p in order if p not in tally.dropped
                and mean[p] >= mean["full"] - tolerance and low[p] >= floor and top[p] >= top5]

    within = keeping()
    if not within and tally.dropped:    # every path on every request after all
        _complete(scorer, tally, progress)
        mean, low, top = tally.stats()
        within = keeping()
    pick = within[0] if within else max(order, key=lambda p: mean[p])

    def named(table):
        return {("naive" if p == "fast" else p): (round(v, 4) if isinstance(v, float) else v)
                for p, v in table.items()}

    users = {c.user_id for c in cases}
    return {**path_setting(pick, getattr(scorer, "fill", "order")), "item_tail": scorer.tail,
            "user_side": "exact", "within": bool(within),
            "validation": {"users": len(users), "requests": len(cases),
                           "tolerance": tolerance, "floor": floor, "top5_floor": top5,
                           "ndcg10": named(mean), "delta_low": named(low), "top5": named(top),
                           **({"dropped": named(tally.dropped)} if tally.dropped else {})}}


def _complete(scorer, tally: Tally, progress: bool) -> None:
    """Scores the paths left out on the requests they missed (none is left out after)."""
    from tqdm import tqdm

    for i in tqdm(range(len(tally.cases)), desc="dropped paths", unit="request",
                  disable=not progress):
        missing = [p for p in tally.dropped if i not in tally.nd[p]]
        if missing:
            got = scorer.score_case(tally.cases[i], None, only=["full", *missing])
            tally.add(i, {p: got[p] for p in missing} | {"full": tally.full[i]})
    tally.dropped = {}


def _due(manifest: dict, t) -> bool:
    """True when the adapter's fast path is to be chosen: a pointwise adapter with a fast path
    whose choice is missing or was made on another `train.choice_targets`."""
    fast = manifest.get("fast_path")
    return bool(fast) and manifest["train"].get("objective") == "pointwise" and (
        fast.get("validation", {}).get("targets_per_user") != t.choice_targets)


def choose_for_adapter(cfg, folder: Path, ds, again: bool = False) -> None:
    """Names in the manifest the fastest fast path that keeps the full path's ranking on the
    validation users' last `train.choice_targets` requests each (`choose_fast_path`), once: a
    finished adapter without it, or chosen with another count, gets it when the same command
    runs again (`again`: in any case). The validation users, their candidates and the prompt
    are the adapter's (its manifest); `train.choice` says how the paths are scored. Prints
    what it chose and how long it took."""
    from .adapter import read_manifest, record_fast_path

    if not _learnt(folder):
        return
    manifest = read_manifest(folder)
    t = cfg.train
    if not (_due(manifest, t) or again and manifest.get("fast_path")
            and manifest["train"].get("objective") == "pointwise"):
        return
    fast = manifest["fast_path"]
    cases = _cases(manifest, ds, t.choice_targets)
    if not cases:
        return
    if "validation" in fast:   # chosen by an earlier rule: chosen again, the path trained kept
        was = fast["validation"].get("requests", fast["validation"].get("users", "?"))
        fast = manifest.get("trained_fast_path") or fast
        print(f"choosing the fast path again on {t.choice_targets} requests per validation "
              f"user (it was chosen on {was} requests)")
    scorer = _scorer(cfg, folder, ds, fast, manifest)
    start = time.perf_counter()
    chosen = choose_fast_path(scorer, cases, progress=True, drop=t.choice == "sequential")
    chosen["validation"].update(targets_per_user=t.choice_targets, choice=t.choice,
                                seconds=round(time.perf_counter() - start, 1))
    record_fast_path(folder, chosen)
    print(_said(chosen, len(cases)))


def _cases(manifest: dict, ds, targets: int) -> list:
    """The choice's requests: each validation user's (the adapter's split) last `targets`
    requests, with the candidates the adapter was validated with."""
    from ..errors import RcllmError
    from ..eval.protocol import earlier_cases, split_users
    from .data import dataset_digest
    from .validate import EVAL_HISTORY_WINDOW, validation_cases

    if manifest.get("data", {}).get("digest") not in (None, dataset_digest(ds)):
        raise RcllmError(f"the adapter was trained on other data than {ds.name}: give the "
                         "data it was trained on")
    split, mt = manifest["split"], manifest["train"]
    val_users = split_users(ds, tuple(split["fractions"]), int(split["seed"]))[1]
    return earlier_cases(ds, validation_cases(ds, val_users, mt["val_candidates"],
                                              mt["val_users"]),
                         targets - 1, EVAL_HISTORY_WINDOW)


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


def _scorer(cfg, folder: Path, ds, fast: dict, manifest: dict):
    """The adapter loaded (merged) on the prompt it was trained with, and the scorer of the
    paths `tried` for `fast`: every path in its own pass (`diagnose.Diagnoser`,
    `train.choice=exhaustive`) or what they share once (`choicepaths.SharedPaths`, its
    chunks' passes kept in `train.frozen_cache_gb`)."""
    from ..model.loading import load_model
    from ..prompt.builder import PromptBuilder
    from ..prompt.pointwise import PointwisePrompt
    from .adapter import trained_prompt
    from .choicepaths import SharedPaths
    from .diagnose import Diagnoser

    loaded = load_model(dataclasses.replace(cfg.model, adapter=str(folder)))
    builder = PromptBuilder(loaded.tokenizer, ds.items, trained_prompt(manifest),
                            loaded.model.arch.max_positions, "verbalizer")
    pw = PointwisePrompt(builder, loaded.model.arch.max_positions)
    depths, ratios = tried(fast, loaded.model.arch.num_layers)
    args = (loaded.model, pw, int(fast["item_tail"]), depths, ratios,
            fast.get("overlap_fill", "order"))
    if cfg.train.choice == "exhaustive":
        return Diagnoser(*args)
    return SharedPaths(*args, cache_bytes=int(cfg.train.frozen_cache_gb * 2**30))


def _said(chosen: dict, requests: int) -> str:
    """The line that tells what the choice found and named."""
    val = chosen["validation"]
    v, top5, dropped = val["ndcg10"], val["top5"], val.get("dropped", {})
    return (f"fast-path choice ({val['choice']}, {val['seconds']:.0f} s) on {requests} "
            f"requests of {val['users']} validation users (NDCG@10, top-5 agreement"
            + ("; * dropped after the requests shown" if dropped else "") + "): "
            + ", ".join(f"{k} {x:.3f} {top5[k]:.2f}"
                        + (f"*{dropped[k]['requests']}" if k in dropped else "")
                        for k, x in v.items())
            + f"; the adapter serves {path_name(chosen)}"
            + ("" if chosen["within"] else " (the closest: none keeps the full path's ranking: "
                                           "within 0.02, lower end >= -0.05, top-5 >= 0.8)"))
