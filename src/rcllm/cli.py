"""The `rcllm` entry point.

Each command lives in its own module with a `register(top, bench)` function: `top` is the
subparsers of `rcllm`, `bench` the subparsers of `rcllm bench`. A command's parser sets
`func=callable(args) -> int`. Modules are imported lazily per run so that `rcllm --help` does
not import torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .errors import RcllmError

# One entry per module that registers commands; a feature adds its module here.
COMMAND_MODULES = (
    "rcllm.commands.bench_prefill",
    "rcllm.commands.bench_shapes",
    "rcllm.commands.bench_ttft",
    "rcllm.commands.build_cache",
    "rcllm.commands.build_history",
    "rcllm.commands.eval",
    "rcllm.commands.diagnose",
    "rcllm.commands.finetune",
    "rcllm.commands.rank",
    "rcllm.commands.checkpoints",
    "rcllm.commands.sim",
    "rcllm.commands.kvstore",
    "rcllm.commands.shard",
    "rcllm.commands.userprefix",
    "rcllm.commands.serve",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rcllm",
        description="Beyond-prefix KV cache reuse for LLM recommendation.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench_parser = top.add_parser("bench", help="benchmarks that print ratios measured in one run")
    bench = bench_parser.add_subparsers(dest="bench", metavar="BENCH")
    bench_parser.set_defaults(func=lambda _a: (bench_parser.print_help(), 2)[1])
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(top, bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except RcllmError as exc:
        print(f"rcllm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rcllm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
