"""Where a selective prefill spends its time on a device: torch.profiler over one prefill per
method of `bench shapes`' synthetic prompt (random weights), the top operators by host and by
device time, and the host-device synchronisations (`.item()`, `nonzero`, copies to the host).

    python scripts/profile_gpu_prefill.py [--shape qwen3-8b] [--device cuda] [--tokens 2048]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rcllm.bench import shapes as sh

SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::to",
            "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--methods", default="full,naive,cacheblend:0.3,rcllm:0.3")
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args()
    shape = sh.SHAPES[args.shape]
    if args.layers:
        shape = shape.with_layers(args.layers)
    device, dtype = sh.resolve_device(args.device, None)
    model = sh.random_transformer(shape, device, dtype, args.tokens + 64)
    inputs = sh.Inputs(model, sh.synthetic_prompt(args.tokens, shape.vocab))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for spec in args.methods.split(","):
        method, _, r = spec.partition(":")
        v = sh.Variant(method, float(r or 0), float(r or 0))
        for _ in range(3):
            ms, _res, _l = sh.timed_prefill(model, inputs, v)
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            ms, _res, _l = sh.timed_prefill(model, inputs, v)
            wall = (time.perf_counter() - t0) * 1e3
        ev = prof.key_averages()
        print(f"\n=== {v.name} at {args.tokens} tokens: {ms:.1f} ms timed ({wall:.1f} ms "
              f"profiled) ===")
        syncs = {e.key: e.count for e in ev if e.key in SYNC_OPS}
        print("sync-prone calls:", syncs)
        print("kernel launches:", sum(e.count for e in ev if e.key == "cudaLaunchKernel"))
        for sort in ("self_cpu_time_total", "self_cuda_time_total")[:1 + (device.type == "cuda")]:
            print(ev.table(sort_by=sort, row_limit=args.top, max_name_column_width=40))


if __name__ == "__main__":
    main()
