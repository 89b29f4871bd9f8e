"""`rcllm finetune`: LoRA fine-tuning of the model as a ranker on the full and the fast path
(docs/finetune.md)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..errors import RcllmError

# what `rcllm finetune` writes into an adapter folder: --fresh removes these and nothing else
ADAPTER_FILES = ("adapter.json", "adapter.safetensors")
CHECKPOINT_FILES = ("checkpoint/state.json", "checkpoint/state.safetensors")

# `--recipe NAME`: named chains of runs, each stage warm-started from the one before
# (`train.init`). A stage is (label, overrides); the user's --set options apply to every stage
# and may not name a key a stage sets. Superseded by the default joint objective (one run
# trains the full and the reuse path together); kept so that the measured chain can be rerun.
FORMER = ("train.batch=1", "train.val_users=0")  # one prompt per step, no validation
TAIL = ("train.path=reuse", "train.reuse_tail=1", *FORMER)
RECIPES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    # Gift Cards (2026-12-01): the standard adapter, then three item-tail stages
    "item-tail": (
        ("standard", ("train.path=full", "train.steps=720", *FORMER)),
        ("item tail, stage 1", (*TAIL, "train.lr=5e-4", "train.steps=300")),
        ("item tail, stage 2", (*TAIL, "train.lr=3e-4", "train.steps=400")),
        ("item tail, stage 3", (*TAIL, "train.lr=2e-4", "train.steps=400", "train.seed=1")),
    ),
}


def _describe() -> list[str]:
    """Option lines with this command's defaults (its prompt defaults differ from the engine's,
    which `config.describe` would show)."""
    from dataclasses import fields

    from ..finetune.config import FinetuneConfig

    cfg, lines = FinetuneConfig(), []
    for section in fields(cfg):
        sub = getattr(cfg, section.name)
        for f in fields(sub):
            lines.append(f"  {section.name}.{f.name} = {getattr(sub, f.name)!r}  "
                         f"({f.metadata.get('help', '')})")
    return lines


def _data_options(p) -> None:
    p.add_argument("--data", metavar="PATH",
                   help="dataset path (default: the built-in synthetic workload)")
    p.add_argument("--format", default="amazon2018",
                   help="dataset format: amazon2018, amazon2023, yelp, goodreads, movielens, "
                        "synthetic (default amazon2018)")
    p.add_argument("--category", help="category name when --data is an Amazon folder")
    p.add_argument("--config", metavar="FILE", help="YAML file of options (see --set)")


def register(top, bench) -> None:
    p = top.add_parser("finetune", help="LoRA-tune the model to rank (training users only)",
                       formatter_class=argparse.RawTextHelpFormatter)
    _data_options(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one option (repeatable); options and defaults:\n"
                        + "\n".join(_describe()))
    p.add_argument("--out", metavar="DIR", help="adapter folder (default: the cache folder "
                                                "keyed by model, data and options)")
    p.add_argument("--recipe", choices=sorted(RECIPES),
                   help="train a chain of stages, each warm-started from the one before, and "
                        "print the last adapter:\n"
                        + "\n".join(f"  {name}: " + " -> ".join(label for label, _ in stages)
                                    for name, stages in RECIPES.items())
                        + "\n(a finished stage is found in the cache folder, not retrained; "
                          "--set train.init=ADAPTER takes a finished adapter as the first "
                          "stage; --out names the last stage's folder)")
    p.add_argument("--overfit", type=int, default=0, metavar="N",
                   help="do not train an adapter: fit the first N training prompts (fixed "
                        "candidates) for --overfit-steps steps on the configured path(s) and "
                        "print the loss per step (near zero = the model can learn this path)")
    p.add_argument("--overfit-steps", type=int, default=60, metavar="S")
    p.add_argument("--rechoose", action="store_true",
                   help="choose the finished adapter's fast path again (no training; weights "
                        "unchanged) and print the choice's time; with --set "
                        "train.choice=exhaustive, the former way")
    p.add_argument("--fresh", action="store_true",
                   help="discard a checkpoint or finished adapter in the folder and start over (only the "
                        "files finetune writes; a folder that is not an adapter folder is refused)")
    p.set_defaults(func=run)
    b = bench.add_parser("finetune", help="training prompts/s per variant (threads, first "
                                          "adapted layer) on the same prompts, vs the first",
                         formatter_class=argparse.RawTextHelpFormatter)
    _data_options(b)
    b.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a finetune option for every variant (see rcllm finetune --help)")
    b.add_argument("--variants", default="1:0,2:0,2:20:whole,2:20", metavar="T:L[:whole],...",
                   help="THREADS:FIRST_LAYER per variant, :whole to compute the reuse path's "
                        "chunk pass\nwhole in every prompt (train.item_cache=false); ratios are "
                        "against the first\n(default 1:0,2:0,2:20:whole,2:20: one thread "
                        "adapting every layer, the former\ndefault; both cores; both cores from "
                        "layer 20 without, then with, the item\nchunks' states kept, the "
                        "default)")
    b.add_argument("--prompts", type=int, default=4, help="timed prompts per pass (default 4)")
    b.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    b.set_defaults(func=run_bench)


def run_bench(args) -> int:
    from ..bench.finetune import Variant, measure, table
    from ..config import load
    from ..finetune.config import FinetuneConfig
    from .common import load_data

    variants = [Variant.parse(v) for v in args.variants.split(",") if v.strip()]
    if not variants or args.prompts < 1:
        raise RcllmError("give at least one variant and --prompts >= 1")
    epochs = load(FinetuneConfig, args.config, args.overrides).train.epochs  # checks --set
    ds = load_data(args)
    rows = []
    for v in variants:
        rows.append(measure(ds, v, args.prompts, args.overrides, args.config))
        print(f"{v.label}: {rows[-1]['first_per_s']:.3f} prompts/s first pass, "
              f"{rows[-1]['again_per_s']:.3f} again", flush=True)
    lines, summary = table(rows, epochs)
    print("\n".join(lines))
    if args.json:
        from ..report import write_report

        write_report(args.json, "bench_finetune",
                     {"data": ds.name, "prompts": args.prompts, "epochs": epochs,
                      "overrides": args.overrides}, rows, summary)
    return 0


def run(args) -> int:
    from .common import load_data

    if args.fresh and args.out:
        check_discardable(Path(args.out))   # before minutes of loading, not after
    if args.overfit:
        return _overfit(args, load_data(args))
    if args.recipe:
        _check_recipe(args)                 # before loading, too
        return _run_recipe(args, load_data(args))
    folder = _train(args, args.overrides, args.out, load_data(args))
    print(f"use it: rcllm eval --adapter {folder} --data ... --users heldout --candidates 20 "
          f"--methods full,naive --baselines")
    return 0


def _setup(args, overrides: list[str], ds):
    """(config, train users, validation users, loaded model, run key)."""
    from ..config import load
    from ..eval.protocol import split_users
    from ..finetune.config import FinetuneConfig
    from ..finetune.data import dataset_digest, training_stream
    from ..finetune.trainer import run_key
    from ..model.loading import load_model

    cfg = load(FinetuneConfig, args.config, overrides)
    train_users, val_users, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    capped = training_stream(ds, train_users, cfg).capped   # before the model loads
    loaded = load_model(cfg.model)
    return cfg, train_users, val_users, loaded, run_key(loaded.fingerprint,
                                                         dataset_digest(ds), cfg, capped)


def _train(args, overrides: list[str], out: str | None, ds) -> Path:
    """One run: trains (or finds finished) the adapter of these options; returns its folder."""
    from ..finetune.choice import choose_for_adapter
    from ..finetune.trainer import Trainer, adapter_folder, finished

    cfg, train_users, val_users, loaded, key = _setup(args, overrides, ds)
    folder = Path(out) if out else adapter_folder(cfg, key)
    if args.fresh:
        discard_run(folder)
    if finished(folder):
        print(f"already trained: {folder}")
    elif args.rechoose:
        raise RcllmError(f"--rechoose: {folder} holds no finished adapter (give its --out, or "
                         "the options it was trained with)")
    else:
        print(f"data: {ds.name}, {len(train_users)} training users, {len(val_users)} validation "
              f"users; adapter folder {folder}")
        start = time.perf_counter()
        trainer = Trainer(loaded, ds, train_users, cfg, folder, key, val_users)
        st = trainer.stream
        cut = (f" (of {st.available}: train.max_examples={cfg.train.max_examples} keeps each "
               "user's latest targets)" if st.capped else "")
        print(f"{len(st)} training examples{cut}, {trainer.total_steps} steps of "
              f"{cfg.train.batch} prompts, path {cfg.train.path}, validation on "
              f"{len(trainer.val_cases)} users every {trainer.val_every} steps")
        trainer.run(progress=True)
        print(f"trained in {time.perf_counter() - start:.0f} s by this run "
              "(a resumed run continues its checkpoint)")
    choose_for_adapter(cfg, folder, ds, again=args.rechoose)
    _summary(folder)
    return folder


def _overfit(args, ds) -> int:
    """`--overfit N`: the model-capacity check on the configured path(s); saves nothing."""
    import math
    import tempfile

    from ..finetune.trainer import Trainer

    cfg, train_users, _, loaded, key = _setup(args, args.overrides, ds)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(loaded, ds, train_users, cfg, Path(tmp), key)
        start = time.perf_counter()
        rows = trainer.overfit(args.overfit, args.overfit_steps, progress=True)
    print(f"overfit {args.overfit} prompts of {cfg.train.candidates} candidates, path "
          f"{cfg.train.path}, lr {cfg.train.lr}, {time.perf_counter() - start:.0f} s "
          f"(chance ln C = {math.log(cfg.train.candidates):.3f}):")
    shown = rows[:: max(1, len(rows) // 20)]
    for r in shown + [r for r in rows[-1:] if r is not shown[-1]]:
        print(f"  {r['step']:>4}: " + "  ".join(f"{k} {v:.3f}" for k, v in r.items()
                                                 if k != "step"))
    return 0


def _key(item: str) -> str:
    """The option name of a `--set key=value` item."""
    return item.split("=", 1)[0].strip()


def _given_init(args) -> Path | None:
    """The finished adapter `--set train.init=` names as a recipe's first stage, if any."""
    given = [item for item in args.overrides if _key(item) == "train.init"]
    return Path(given[-1].split("=", 1)[1].strip()).expanduser() if given else None


def _check_recipe(args) -> None:
    """Refuses, before any loading, options that a recipe's stages set themselves, --fresh,
    and a first-stage adapter that is not a finished one."""
    from ..finetune.trainer import finished

    from ..config import file_options

    staged = {_key(item) for _, extra in RECIPES[args.recipe] for item in extra}
    clash = sorted(k for k in map(_key, args.overrides) if k in staged)
    if clash:
        raise RcllmError(f"--recipe {args.recipe} sets {', '.join(clash)} per stage; drop "
                         f"--set {clash[0]} (or train the stages one by one without --recipe)")
    in_file = {k for k, _ in file_options(args.config)} if args.config else set()
    clash = sorted(in_file & (staged | {"train.init"}))
    if clash:  # a stage's --set would silently override the file's value
        raise RcllmError(f"--config {args.config} sets {', '.join(clash)}, which --recipe "
                         f"{args.recipe} sets per stage (train.init: give it as --set); "
                         f"remove it from the file")
    if args.fresh:
        raise RcllmError("--fresh with --recipe would retrain every stage; give --fresh to "
                         "the one run to redo, without --recipe")
    given = _given_init(args)
    if given is not None and not finished(given):
        raise RcllmError(f"train.init={given}: not a finished adapter folder")


def _run_recipe(args, ds) -> int:
    """The stages of `args.recipe` in order, each with `train.init` = the previous folder."""
    stages = RECIPES[args.recipe]
    overrides = [item for item in args.overrides if _key(item) != "train.init"]
    folder = _given_init(args)     # the first stage's adapter, when the user already has it
    for i, (label, extra) in enumerate(stages, 1):
        print(f"== {args.recipe}, stage {i}/{len(stages)}: {label}")
        if i == 1 and folder is not None:
            print(f"given by train.init: {folder}")
            continue
        init = [f"train.init={folder}"] if folder is not None else []
        out = args.out if i == len(stages) else None
        folder = _train(args, [*overrides, *extra, *init], out, ds)
    print(f"use it: rcllm eval --adapter {folder} --data ... --users heldout --methods "
          f"full,naive --baselines")
    return 0


def _is_ours(folder: Path) -> bool:
    """True when `folder` holds an rcllm adapter manifest or training checkpoint."""
    from ..finetune.adapter import read_manifest

    try:
        read_manifest(folder)
        return True
    except RcllmError:
        pass
    try:
        state = json.loads((folder / CHECKPOINT_FILES[0]).read_text())
        return isinstance(state, dict) and "key" in state and "step" in state
    except (OSError, ValueError):
        return False


def check_discardable(folder: Path) -> None:
    """Raises RcllmError unless `folder` is absent, empty, or an rcllm adapter/checkpoint
    folder (so `--fresh --out ~` can never delete a user's files)."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise RcllmError(f"--out {folder} is not a folder")
    if any(folder.iterdir()) and not _is_ours(folder):
        raise RcllmError(f"--fresh: {folder} is not an rcllm adapter or checkpoint folder (no "
                         f"adapter.json or checkpoint/state.json); refusing to delete anything "
                         f"in it. Give a new or empty folder to --out.")


def discard_run(folder: Path) -> None:
    """Removes the adapter and checkpoint files `rcllm finetune` wrote in `folder` (and the
    folders, when that leaves them empty); any other file is kept."""
    check_discardable(folder)
    if not folder.exists():
        return
    for name in ADAPTER_FILES + CHECKPOINT_FILES:
        path = folder / name
        path.unlink(missing_ok=True)
        for tmp in path.parent.glob(f".{path.name}*"):   # write_atomic's leftovers of a crash
            tmp.unlink(missing_ok=True)
    for sub in (folder / "checkpoint", folder):
        try:
            sub.rmdir()          # only when empty
        except OSError:
            pass


def _summary(folder: Path) -> None:
    from ..finetune import curves
    from ..finetune.adapter import read_manifest

    m = read_manifest(folder)
    rate = m.get("prompts_per_s")
    print(f"training time {m['train_seconds']:.0f} s ({m['model']['threads']} threads; "
          f"{m.get('validation_seconds', 0):.0f} s of it validating), "
          f"{m.get('train_prompts')} prompts" + (f", {rate:.3f} prompts/s" if rate else "")
          + (", stopped early" if m.get("stopped_early") else ""))
    try:
        data = json.loads((folder / curves.JSON).read_text())
    except (OSError, ValueError):
        return
    print("\n".join(curves.text(data)))
    print(f"curves: {folder / curves.PNG}")
