"""`bench ttft --compare-flat`: rcllm with one budget in every layer beside the depth schedule."""

from rcllm.bench.ttft import prepare_caches, run_ttft
from rcllm.commands.bench_ttft import FlatVariant
from rcllm.commands.common import Variant
from rcllm.config import RcllmConfig, load
from rcllm.engine import Engine
from rcllm.eval.datasets import load_dataset
from rcllm.eval.protocol import build_cases


def test_flat_rows_run_beside_the_depth_schedule(tiny_loaded):
    ds = load_dataset("", "synthetic", num_users=20, num_items=60, seed=3)
    cases = build_cases(ds, history_window=6, num_negatives=7, seed=0, max_cases=2)
    eng = Engine(tiny_loaded, ds.items, load(RcllmConfig, None, ["reuse.depth_decay=1.0"]))
    prepare_caches(eng, cases)
    flat = FlatVariant("rcllm", 0.3, 0.3)
    assert flat.label == "rcllm 0.3/0.3 flat" and flat.overrides()["depth_decay"] == 0.0
    rows, _ = run_ttft(eng, cases, [Variant("full"), Variant("rcllm", 0.3, 0.3), flat])
    by = {r["variant"]: r for r in rows}
    # the same layer-1 selection, fewer tokens in the layers above: a higher FLOP bound
    assert by["rcllm 0.3/0.3"]["recomputed_fraction"] == by["rcllm 0.3/0.3 flat"]["recomputed_fraction"]
    assert by["rcllm 0.3/0.3"]["flop_bound_speedup"] > by["rcllm 0.3/0.3 flat"]["flop_bound_speedup"]
