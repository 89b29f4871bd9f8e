"""`rcllm bench prefill`: this engine's full prefill vs transformers' forward, one run.

Rows: tokens, engine_ms, transformers_ms (the default forward, all-position logits),
transformers_last_ms (logits_to_keep=1, the fairest comparison), speedup_vs_transformers,
gflops (engine). Summary: matmul_peak_gflops (an fp32 GEMM of the model's MLP shape measured
in the same run), speedup_vs_transformers_2048, floor_ratio_2048 (engine time / FLOP floor
time at that peak).
"""

from __future__ import annotations

import argparse
import statistics
import time

from ..report import markdown_table, write_report
from .common import add_engine_options, engine_config


def register(top, bench) -> None:
    p = bench.add_parser("prefill", help="engine prefill vs transformers, and vs the FLOP floor",
                         formatter_class=argparse.RawTextHelpFormatter)
    add_engine_options(p)
    p.add_argument("--tokens", default="512,1024,2048,4096",
                   help="comma-separated prompt lengths (default 512,1024,2048,4096)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats per length (median)")
    p.add_argument("--json", metavar="PATH", help="write the report (reporting contract)")
    p.set_defaults(func=run)


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def matmul_peak_gflops(d: int, f: int, n: int = 2048, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(n, d), torch.randn(f, d)
    ms = _median_ms(lambda: torch.nn.functional.linear(a, b), repeats)
    return 2 * n * d * f / (ms * 1e-3) / 1e9


def run(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from ..errors import RcllmError
    from ..model.loading import load_model

    cfg = engine_config(args)
    lengths = [int(x) for x in args.tokens.split(",") if x.strip()]
    loaded = load_model(cfg.model)
    model = loaded.model
    if max(lengths) > model.arch.max_positions:
        raise RcllmError(f"--tokens up to {max(lengths)} exceeds the model's context "
                         f"{model.arch.max_positions}")
    hf = AutoModelForCausalLM.from_pretrained(str(loaded.folder), dtype=model.dtype)
    hf.eval()
    a = model.arch
    peak = matmul_peak_gflops(a.hidden_size, a.intermediate_size)
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for n in lengths:
            ids = torch.randint(100, a.vocab_size - 100, (n,), generator=gen)
            eng = _median_ms(lambda: model.forward(ids), args.repeats)
            ref = _median_ms(lambda: hf(ids[None]), args.repeats)
            ref_last = _median_ms(lambda: hf(ids[None], logits_to_keep=1), args.repeats)
            flops = (a.params_per_token_flops() * n + a.attention_flops(n * (n + 1) // 2)
                     + 2 * a.hidden_size * a.vocab_size)
            rows.append({"tokens": n, "engine_ms": eng, "transformers_ms": ref,
                         "transformers_last_ms": ref_last, "speedup_vs_transformers": ref / eng,
                         "speedup_vs_transformers_last": ref_last / eng,
                         "gflops": flops / (eng * 1e-3) / 1e9,
                         "floor_ratio": (eng * 1e-3) / (flops / (peak * 1e9))})
            print(f"{n} tokens: engine {eng:.0f} ms, transformers {ref:.0f} ms", flush=True)
    at = {r["tokens"]: r for r in rows}
    summary = {"matmul_peak_gflops": peak,
               "speedup_vs_transformers_2048": at[2048]["speedup_vs_transformers"] if 2048 in at else None,
               "floor_ratio_2048": at[2048]["floor_ratio"] if 2048 in at else None,
               "threads": torch.get_num_threads()}
    print(markdown_table(rows, ("tokens", "engine_ms", "transformers_ms", "transformers_last_ms",
                                "speedup_vs_transformers", "speedup_vs_transformers_last",
                                "gflops", "floor_ratio")))
    print(f"matmul peak {peak:.0f} GFLOP/s on {torch.get_num_threads()} threads")
    if args.json:
        write_report(args.json, "bench_prefill", {"engine": cfg, "tokens": lengths,
                                                  "repeats": args.repeats}, rows, summary)
    return 0
