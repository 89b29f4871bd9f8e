"""`rcllm bench shapes`: the paper's model shape with random weights, selective-prefill TTFT of
full / prefix / naive / cacheblend / rcllm on synthetic 2–4k-token recommendation prompts, and
a speed profile fitted from the same run (`--profile-out`) for the simulator and the router.

Runs on a GPU (`--device cuda`, bfloat16 by default) or, with a scaled-down shape, on a CPU.
See rcllm.bench.shapes for what is timed and docs/reporting.md for the report keys.
"""

from __future__ import annotations

import argparse
import time

from ..errors import RcllmError
from ..report import markdown_table, write_report
from .common import positive_ints

COLUMNS = ("tokens", "variant", "ttft_p50_ms", "speedup_vs_full", "speedup_vs_prefix",
           "recomputed_fraction", "flop_bound_speedup", "measured_vs_flop_bound")


def register(top, bench) -> None:
    p = bench.add_parser("shapes", help="paper-shape model (random weights): TTFT per method "
                                        "and a fitted speed profile, CPU or GPU",
                         formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", default="qwen3-8b", help="qwen3-8b (default) or tiny")
    p.add_argument("--layers", type=int, help="override the shape's layer count (scaled runs)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--dtype", help="float32 | bfloat16 | float16 (default: bfloat16 on CUDA, "
                                   "float32 on CPU)")
    p.add_argument("--tokens", default="2048,4096", help="comma-separated prompt lengths "
                                                        "(default 2048,4096)")
    p.add_argument("--ratios", default="0.15,0.3",
                   help="cacheblend r and rcllm r/r budgets (default 0.15,0.3)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per variant (p50)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0 = leave)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the report (reporting contract)")
    p.add_argument("--profile-out", metavar="PATH",
                   help="write the fitted speed profile (the router's --profile JSON format)")
    p.set_defaults(func=run)


def _ratios(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RcllmError(f"--ratios must be comma-separated numbers, not {text!r}") from None
    if any(not 0.0 <= r <= 1.0 for r in out):
        raise RcllmError("--ratios must be within [0, 1]")
    return out


def run(args) -> int:
    import torch

    from ..bench import shapes as sh

    if args.shape not in sh.SHAPES:
        raise RcllmError(f"unknown --shape {args.shape!r}; known: {', '.join(sh.SHAPES)}")
    if args.repeats < 1 or args.warmup < 0:
        raise RcllmError("--repeats must be >= 1 and --warmup >= 0")
    shape = sh.SHAPES[args.shape]
    if args.layers is not None:
        if args.layers < 2:
            raise RcllmError("--layers must be >= 2 (the probe reads layer 1)")
        shape = shape.with_layers(args.layers)
    tokens = positive_ints(args.tokens, "--tokens")
    ratios = _ratios(args.ratios)
    device, dtype = sh.resolve_device(args.device, args.dtype)
    if args.threads and device.type == "cpu":
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = sh.random_transformer(shape, device, dtype, max(tokens) + sh.PREFIX_BLOCK, args.seed)
    build_s = time.perf_counter() - t0
    label = sh.device_label(device)

    def log(n, rows):
        print(f"\n{n} tokens ({shape.name}, {label}, {str(dtype).removeprefix('torch.')}):")
        print(markdown_table(rows, COLUMNS))

    rows, exact = sh.measure(model, tokens, sh.variants(ratios), args.repeats, args.warmup,
                             args.seed, log)
    profile, fit_err = sh.fit_profile(rows, shape, model, label)
    summary = _summary(shape, label, dtype, device, build_s, t0, exact, rows, profile, fit_err)
    print(f"\nexactness (rcllm 1.0/1.0 vs full, last hidden): max |diff| "
          f"{summary['exact_max_abs_diff']:.3g}")
    print(f"fitted profile {profile.name}: fixed {profile.fixed_ms:.3g} ms, "
          f"{profile.ms_per_token:.3g} ms/token, {profile.ms_per_token_ctx:.3g} ms/token/ctx; "
          "median rel. error " + ", ".join(f"{m} {e:.3f}" for m, e in fit_err.items()))
    config = {"shape": args.shape, "layers": shape.spec.num_layers, "device": args.device,
              "dtype": summary["dtype"], "tokens": tokens, "ratios": ratios,
              "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed}
    if args.profile_out:
        from ..serve.calibrate import save_profile

        save_profile(profile, args.profile_out)
        print(f"profile written to {args.profile_out}")
    if args.json:
        write_report(args.json, "bench_shapes", config, rows, summary)
    return 0


def _summary(shape, label, dtype, device, build_s, t0, exact, rows, profile, fit_err) -> dict:
    """The JSON summary: the run's setting, exactness, the fitted profile and the speed-ups."""
    import dataclasses

    import torch

    summary = {
        "shape": {**dataclasses.asdict(shape.spec), "vocab": shape.vocab}, "device": label,
        "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        # whether the prefill needed the model dtype as default (bench.shapes.timed_prefill)
        "default_dtype_workaround": any(e["default_dtype_workaround"] for e in exact.values()),
        "model_build_s": build_s, "wall_s": time.perf_counter() - t0,
        "exactness": {str(n): e for n, e in exact.items()},
        "exact_max_abs_diff": max(e["rcllm"]["max_abs_diff"] for e in exact.values()),
        "profile": dataclasses.asdict(profile), "profile_fit_median_rel_err": fit_err}
    for r in rows:
        if r["method"] == "rcllm":
            key = f"rcllm_{r['item_ratio']:g}_{r['history_ratio']:g}_speedup_vs_full_{r['tokens']}"
            summary[key] = r["speedup_vs_full"]
    return summary
