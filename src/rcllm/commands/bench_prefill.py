"""`rcllm bench prefill`: this engine's full prefill vs transformers' forward, one run.

The engine computes logits at the last position only, so the headline compares against
transformers doing the same (`logits_to_keep=1`); transformers' default forward (logits at every
position, a vocabulary-sized matmul per token) is kept as a second comparison.

Rows: tokens, engine_ms, transformers_last_ms, speedup_vs_transformers_last (headline),
transformers_all_ms, speedup_vs_transformers_all, gflops (engine), floor_ratio. Summary:
matmul_peak_gflops (an fp32 GEMM of the model's MLP shape measured in the same run),
speedup_vs_transformers_last_2048 (headline), speedup_vs_transformers_all_2048,
floor_ratio_2048 (engine time / FLOP floor time at that peak), threads.
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


def summarize(rows: list[dict], peak: float, threads: int) -> dict:
    at = {r["tokens"]: r for r in rows}.get(2048)
    return {"matmul_peak_gflops": peak,
            "speedup_vs_transformers_last_2048": at["speedup_vs_transformers_last"] if at else None,
            "speedup_vs_transformers_all_2048": at["speedup_vs_transformers_all"] if at else None,
            "floor_ratio_2048": at["floor_ratio"] if at else None, "threads": threads}


def headline(summary: dict) -> str:
    """The fair comparison first: transformers computing logits at the last position only."""
    out = f"matmul peak {summary['matmul_peak_gflops']:.0f} GFLOP/s on {summary['threads']} threads"
    if summary["speedup_vs_transformers_last_2048"] is not None:
        out = (f"at 2048 tokens: {summary['speedup_vs_transformers_last_2048']:.2f}x "
               f"transformers with last-position logits (headline; "
               f"{summary['speedup_vs_transformers_all_2048']:.2f}x its default all-position "
               f"forward), {summary['floor_ratio_2048']:.2f}x the FLOP floor; " + out)
    return out


def run(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from ..errors import RcllmError
    from ..model.loading import load_model

    cfg = engine_config(args)
    try:
        lengths = [int(x) for x in args.tokens.split(",") if x.strip()]
    except ValueError:
        raise RcllmError(f"--tokens must be comma-separated integers, got {args.tokens!r}") from None
    if not lengths or min(lengths) < 1 or args.repeats < 1:
        raise RcllmError("--tokens needs at least one positive length and --repeats >= 1")
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
            rows.append({"tokens": n, "engine_ms": eng,
                         "transformers_last_ms": ref_last,
                         "speedup_vs_transformers_last": ref_last / eng,
                         "transformers_all_ms": ref, "speedup_vs_transformers_all": ref / eng,
                         "gflops": flops / (eng * 1e-3) / 1e9,
                         "floor_ratio": (eng * 1e-3) / (flops / (peak * 1e9))})
            print(f"{n} tokens: engine {eng:.0f} ms, transformers (last-position logits) "
                  f"{ref_last:.0f} ms, (all-position logits) {ref:.0f} ms", flush=True)
    summary = summarize(rows, peak, torch.get_num_threads())
    print(markdown_table(rows, ("tokens", "engine_ms", "transformers_last_ms",
                                "speedup_vs_transformers_last", "transformers_all_ms",
                                "speedup_vs_transformers_all", "gflops", "floor_ratio")))
    print(headline(summary))
    if args.json:
        write_report(args.json, "bench_prefill", {"engine": cfg, "tokens": lengths,
                                                  "repeats": args.repeats}, rows, summary)
    return 0
