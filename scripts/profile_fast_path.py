"""Where a pointwise fast-path request's time goes with the user prefix cached: per request the
engine's TTFT split (prompt build, look-ups and KV gather, prefill) and the tokens it computed,
then a cProfile of the timed calls (the ops that took the time). Same workload and engine as
`rcllm bench ttft --adapter A --scorer pointwise` (the `naive +user prefix` row).

    python scripts/profile_fast_path.py --adapter ADAPTER --data ../shared/data/amazon2018 \
        --category Magazine_Subscriptions [--requests 8] [--method naive] [--set model.threads=1]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv: list[str]) -> int:
    from rcllm import cli
    from rcllm.bench.ttft import prepare_caches
    from rcllm.commands.common import engine_config, load_workload, make_engine
    from rcllm.finetune.adapter import eval_settings
    from rcllm.prompt.builder import RankRequest

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--method", default="naive")
    mine, rest = own.parse_known_args(argv)
    method = mine.method
    args = cli.build_parser().parse_args(["bench", "ttft", "--scorer", "pointwise", *rest])
    if not args.adapter:
        sys.exit("--adapter ADAPTER is required (a pointwise adapter from `rcllm finetune`)")
    cfg, _, _ = eval_settings(engine_config(args), args.adapter)
    ds, cases = load_workload(args)
    engine = make_engine(args, ds, scorer="pointwise", cfg=cfg)
    prepare_caches(engine, cases)
    reqs = [RankRequest(c.user_id, c.history, c.candidates) for c in cases]
    opts = dict(prefix_insert=False, cache_misses=False)
    engine.rank(reqs[0], "full", **opts)   # first-call allocations are nobody's cost
    prof = cProfile.Profile()

    def hit(req, profile: bool):
        engine.user_prefixes.invalidate_user(req.user_id)
        engine.rank(req, method, **opts)   # untimed: stores the user side
        if profile:
            prof.enable()
        res = engine.rank(req, method, **opts)
        if profile:
            prof.disable()
        return res

    for r in reqs:   # one pass to warm every shape
        hit(r, False)
    print(f"{method} with the user prefix cached, {len(reqs)} requests, "
          f"{engine.model.arch.num_layers} layers, {cfg.model.threads} thread(s)")
    for r in reqs:
        res = hit(r, True)
        s = res.stats
        print(f"ttft {res.ttft_ms:7.1f} ms = build {s['build_ms']:5.1f} + look-ups/gather "
              f"{s['assemble_ms']:5.1f} + prefill and scores {s['prefill_ms']:7.1f}; "
              f"{s['recomputed_tokens']} of {s['tokens']} tokens computed")
    full = sorted(engine.rank(r, "full", **opts).ttft_ms for r in reqs)
    print(f"full ttft p50 {full[len(full) // 2]:.0f} ms")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
