"""`rcllm finetune`: LoRA fine-tuning of the model as a listwise ranker (docs/finetune.md)."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


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


def register(top, bench) -> None:
    p = top.add_parser("finetune", help="LoRA-tune the model to rank (training users only)",
                       formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", metavar="PATH",
                   help="dataset path (default: the built-in synthetic workload)")
    p.add_argument("--format", default="amazon2018",
                   help="dataset format: amazon2018, amazon2023, yelp, goodreads, movielens, "
                        "synthetic (default amazon2018)")
    p.add_argument("--category", help="category name when --data is an Amazon folder")
    p.add_argument("--config", metavar="FILE", help="YAML file of options (see --set)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one option (repeatable); options and defaults:\n"
                        + "\n".join(_describe()))
    p.add_argument("--out", metavar="DIR", help="adapter folder (default: the cache folder "
                                                "keyed by model, data and options)")
    p.add_argument("--fresh", action="store_true",
                   help="discard a checkpoint or finished adapter in the folder and start over")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..config import load
    from ..eval.protocol import split_users
    from ..finetune.config import FinetuneConfig
    from ..finetune.data import dataset_digest
    from ..finetune.trainer import Trainer, adapter_folder, finished, run_key
    from ..model.loading import load_model
    from .common import load_data

    cfg = load(FinetuneConfig, args.config, args.overrides)
    ds = load_data(args)
    train_users, _, _ = split_users(ds, cfg.train.fractions, cfg.train.split_seed)
    loaded = load_model(cfg.model)
    key = run_key(loaded.fingerprint, dataset_digest(ds), cfg)
    folder = Path(args.out) if args.out else adapter_folder(cfg, key)
    if args.fresh and folder.exists():
        shutil.rmtree(folder)
    if finished(folder):
        print(f"already trained: {folder}")
    else:
        print(f"data: {ds.name}, {len(train_users)} training users; adapter folder {folder}")
        start = time.perf_counter()
        Trainer(loaded, ds, train_users, cfg, folder, key).run(progress=True)
        print(f"trained in {time.perf_counter() - start:.0f} s this session")
    _summary(folder)
    print(f"use it: rcllm eval --adapter {folder} --data ... --users test --baselines")
    return 0


def _summary(folder: Path) -> None:
    from ..finetune.adapter import read_manifest

    m = read_manifest(folder)
    curve = m["loss_curve"]
    print(f"training time {m['train_seconds']:.0f} s ({m['model']['threads']} threads); "
          f"loss per {m['train']['log_every']} steps:")
    print("  " + "  ".join(f"{step}:{loss:.2f}/{acc:.2f}" for step, loss, acc in curve)
          + "   (step:loss/top-1 hit rate on the training prompts)")
