"""The paper's model shapes with random weights: selective-prefill TTFT per method, and a speed
profile fitted from the measurements that the simulator can load (`rcllm bench shapes`).

No checkpoint is needed: `random_transformer` builds a `Transformer` of a given shape with
random weights directly on the device (bfloat16 on CUDA, float32 on CPU), and
`synthetic_prompt` lays out a recommendation prompt the way `Engine._assemble` does
(instruction, a bullet + history chunk per review, the items header, a label + item chunk per
candidate, the question; `kind` / `offset` codes as the engine sets them). Per method the
inputs are what the engine would hand the prefill:

- full: nothing cached;
- prefix: the instruction's whole 16-token blocks as exact KV (computed by the model);
- naive / cacheblend / rcllm: the exact instruction prefix plus every history and item chunk
  reused from "cached" KV (random values: only the timing and the selection's mechanics are
  real, not the cached content).

`rcllm.prefill.selective.prefill` (plus the last position's logits) is timed directly, with
`torch.cuda.synchronize` around each timing on CUDA; prompt build and the KV gather into the
prefill buffers are not part of it (the cost model prices KV transfer separately). Methods are
interleaved per repeat so drift hits them alike; speedups are ratios of p50s of one run.

The fitted profile is `schedule.fit.fit_cpu_profile` (fixed + per computed token + per computed
token × context + a reuse cost per method, non-negative, relative error) over the p50 of every
(prompt length, variant), on a base whose `ModelSpec` is the benchmarked shape (KV bytes in the
run's dtype) and, on CUDA, PCIe host transfer overlapped with compute as `profiles.gpu_profile`
assumes. It is written in the router's profile JSON format (`serve.calibrate.save_profile`,
read back by `load_profile`), so it replaces the Vidur-borrowed efficiencies wherever a
`SpeedProfile` is taken.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Sequence

import torch

from ..config import ReuseConfig
from ..errors import RcllmError
from ..model.arch import ModelArch
from ..model.transformer import LayerWeights, Transformer
from ..prefill.selection import selection_policy
from ..prefill.selective import PrefillInputs, prefill
from ..prompt.builder import KINDS
from ..routing.profiles import (MODELS, NETWORK_BYTES_PER_S, PCIE_BYTES_PER_S, ModelSpec,
                                 SpeedProfile)

PREFIX_BLOCK = 16       # the prefix cache's block (reuse.prefix_block default)
HISTORY_CHUNKS = 10     # prompt.history_window
ITEM_CHUNKS = 20        # candidates per request
BULLET, LABEL, HEADER, QUESTION = 2, 3, 6, 16   # dynamic segment lengths (tokens)
INIT_STD = 0.02         # HF initializer_range: keeps 36 random layers finite in bfloat16


@dataclass(frozen=True)
class Shape:
    """A benchmarked shape: the simulator's `ModelSpec` plus a vocabulary (Qwen3 blocks)."""

    spec: ModelSpec
    vocab: int

    @property
    def name(self) -> str:
        return self.spec.name

    def arch(self, max_positions: int) -> ModelArch:
        m = self.spec
        return ModelArch(model_type="qwen3", vocab_size=self.vocab, hidden_size=m.hidden,
                         intermediate_size=m.mlp_hidden, num_layers=m.num_layers,
                         num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                         head_dim=m.head_dim, rope_theta=1e6, rms_eps=1e-6,
                         max_positions=max_positions, tie_embeddings=False, qk_norm=True,
                         qkv_bias=False)

    def with_layers(self, layers: int) -> "Shape":
        return Shape(dataclasses.replace(self.spec, num_layers=layers), self.vocab)


SHAPES = {
    # Qwen3-8B (the simulator's own spec) without its 151k vocabulary: only the last
    # position's logits are computed
    "qwen3-8b": Shape(MODELS["qwen3-8b"], 32000),
    # a scaled-down shape for CPU runs and the test
    "tiny": Shape(ModelSpec("tiny", 2, 128, 4, 2, 32, 256), 512),
}


@dataclass(frozen=True)
class Variant:
    method: str
    item_ratio: float = 0.0
    history_ratio: float = 0.0

    @property
    def name(self) -> str:
        if self.method == "cacheblend":
            return f"cacheblend {self.item_ratio:g}"
        if self.method == "rcllm":
            return f"rcllm {self.item_ratio:g}/{self.history_ratio:g}"
        return self.method

    def policy(self):
        return selection_policy(ReuseConfig(method=self.method, item_ratio=self.item_ratio,
                                            history_ratio=self.history_ratio))


def variants(ratios: Sequence[float]) -> list[Variant]:
    """full, prefix, naive, then cacheblend r and rcllm r/r for each ratio."""
    out = [Variant("full"), Variant("prefix"), Variant("naive")]
    out += [Variant("cacheblend", r, r) for r in ratios]
    out += [Variant("rcllm", r, r) for r in ratios]
    return out


def resolve_device(device: str, dtype: str | None) -> tuple[torch.device, torch.dtype]:
    """(device, dtype) with clear errors; dtype None = bfloat16 on CUDA, float32 on CPU."""
    if not (device == "cpu" or device.startswith("cuda")):
        raise RcllmError(f"--device must be cpu or cuda[:N], not {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RcllmError(f"--device {device}: no CUDA device is available (torch "
                         f"{torch.__version__}); run on a GPU machine or use --device cpu")
    name = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if name not in ("float32", "bfloat16", "float16"):
        raise RcllmError(f"--dtype must be float32, bfloat16 or float16, not {name!r}")
    return torch.device(device), getattr(torch, name)


def random_transformer(shape: Shape, device, dtype, max_positions: int,
                       seed: int = 0) -> Transformer:
    """A Transformer of `shape` with N(0, 0.02) weights and unit norms, made on `device`."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    a = shape.arch(max_positions)

    def rnd(*size):
        return (torch.randn(*size, generator=gen, device=device, dtype=dtype) * INIT_STD)

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    qkv_rows = (a.num_heads + 2 * a.num_kv_heads) * a.head_dim
    layers = [LayerWeights(
        attn_norm=ones(a.hidden_size), w_qkv=rnd(qkv_rows, a.hidden_size), b_qkv=None,
        q_norm=ones(a.head_dim) if a.qk_norm else None,
        k_norm=ones(a.head_dim) if a.qk_norm else None,
        w_o=rnd(a.hidden_size, a.num_heads * a.head_dim), mlp_norm=ones(a.hidden_size),
        w_gate_up=rnd(2 * a.intermediate_size, a.hidden_size),
        w_down=rnd(a.hidden_size, a.intermediate_size)) for _ in range(a.num_layers)]
    return Transformer(a, rnd(a.vocab_size, a.hidden_size), layers, ones(a.hidden_size),
                       rnd(a.vocab_size, a.hidden_size))


@dataclass
class SyntheticPrompt:
    """A recommendation prompt's tokens and the engine's per-slot codes (on the CPU)."""

    ids: torch.Tensor        # [N]
    kind: torch.Tensor       # [N] int8 KINDS codes
    offset: torch.Tensor     # [N] position inside its chunk, 0 elsewhere
    chunk: torch.Tensor      # [N] bool: history / item chunk token (reused by the reuse methods)
    instruction: int         # instruction tokens (slots [0, instruction))

    @property
    def prefix_tokens(self) -> int:
        """The instruction's whole prefix-cache blocks (what an exact prefix hit covers)."""
        return self.instruction - self.instruction % PREFIX_BLOCK


def synthetic_prompt(tokens: int, vocab: int, seed: int = 0) -> SyntheticPrompt:
    """`tokens` slots laid out as instruction, (bullet, history chunk) × 10, items header,
    (label, item chunk) × 20, question; chunk lengths fill what the other segments leave."""
    instruction = min(192, max(32, tokens // 16 // PREFIX_BLOCK * PREFIX_BLOCK))
    fixed = (instruction + HISTORY_CHUNKS * BULLET + HEADER + ITEM_CHUNKS * LABEL + QUESTION)
    chunks = HISTORY_CHUNKS + ITEM_CHUNKS
    if tokens - fixed < 4 * chunks:
        raise RcllmError(f"--tokens {tokens} is too short for 30 chunks of >= 4 tokens "
                         f"(use >= {fixed + 4 * chunks})")
    base, extra = divmod(tokens - fixed, chunks)
    lengths = [base + (i < extra) for i in range(chunks)]
    segments: list[tuple[str, int]] = [("instruction", instruction)]
    for i in range(HISTORY_CHUNKS):
        segments += [("dynamic", BULLET), ("history", lengths[i])]
    segments.append(("dynamic", HEADER))
    for i in range(ITEM_CHUNKS):
        segments += [("dynamic", LABEL), ("item", lengths[HISTORY_CHUNKS + i])]
    segments.append(("question", QUESTION))
    kind = torch.zeros(tokens, dtype=torch.int8)
    offset = torch.zeros(tokens, dtype=torch.long)
    start = 0
    for name, length in segments:
        kind[start:start + length] = KINDS.index(name)
        if name in ("history", "item"):
            offset[start:start + length] = torch.arange(length)
        start += length
    assert start == tokens
    chunk = (kind == KINDS.index("history")) | (kind == KINDS.index("item"))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (tokens,), generator=gen)
    return SyntheticPrompt(ids, kind, offset, chunk, instruction)


class Inputs:
    """Per method, the cached KV template of one prompt; `make` returns fresh PrefillInputs
    (the prefill writes into its buffers, so every run gets its own copy)."""

    def __init__(self, model: Transformer, prompt: SyntheticPrompt, seed: int = 0):
        a, dev = model.arch, model.device
        n = prompt.ids.shape[0]
        self.model, self.prompt = model, prompt
        self.default_dtype = False   # set by timed_prefill when the probe's dtype bug shows
        shape = (a.num_layers, a.num_kv_heads, n, a.head_dim)
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed + 1)
        # "cached" chunk KV: random pre-RoPE keys and values (unit scale, like q/k-normed keys)
        self.k = torch.randn(shape, generator=gen, device=dev, dtype=model.dtype)
        self.v = torch.randn(shape, generator=gen, device=dev, dtype=model.dtype)
        p = prompt.prefix_tokens
        with torch.inference_mode():
            exact = model.forward(prompt.ids[:p].to(dev), return_kv=True)
        self.k[:, :, :p] = exact["k"]
        self.v[:, :, :p] = exact["v"]
        self.ids = prompt.ids.to(dev)
        self.kind = prompt.kind.to(dev)
        self.offset = prompt.offset.to(dev)
        prefix = torch.zeros(n, dtype=torch.bool)
        prefix[:p] = True
        self.masks = {"full": (torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)),
                      "prefix": (prefix, prefix)}
        reused = (prefix | prompt.chunk, prefix)
        for method in ("naive", "epic", "cacheblend", "rcllm"):
            self.masks[method] = reused

    def make(self, method: str) -> PrefillInputs:
        have, exact = self.masks[method]
        dev = self.model.device
        return PrefillInputs(self.ids, self.k.clone(), self.v.clone(), have.to(dev),
                             exact.to(dev), self.kind, self.offset)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def model_default_dtype(model: Transformer):
    """Makes the model's dtype torch's default inside the block (see `timed_prefill`)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(model.dtype if model.dtype.is_floating_point else old)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


DTYPE_BUG = "Index put requires the source and destination dtypes match"


def timed_prefill(model: Transformer, inputs: "Inputs", v: Variant
                  ) -> tuple[float, object, torch.Tensor]:
    """(ms, PrefillResult, last-position logits) of variant v on fresh inputs: the prefill and
    the logits, synchronized on CUDA.

    A selective prefill whose probe writes model-dtype deviations into a float32 buffer fails
    for a bfloat16 / float16 model (cacheblend and rcllm, the engine included); when that error
    appears, this and every later run of `inputs` go under `model_default_dtype`, which gives
    the buffer the model's dtype, and `inputs.default_dtype` records it for the report."""
    policy = v.policy()
    for attempt in (0, 1):
        inp = inputs.make(v.method)
        _sync(model.device)
        t0 = time.perf_counter()
        try:
            with model_default_dtype(model) if inputs.default_dtype else nullcontext():
                res = prefill(model, inp, policy)
        except RuntimeError as exc:
            if attempt or inputs.default_dtype or DTYPE_BUG not in str(exc):
                raise
            inputs.default_dtype = True
            continue
        with torch.inference_mode():
            logits = model.logits(res.hidden_last)
        _sync(model.device)
        return (time.perf_counter() - t0) * 1e3, res, logits
    raise AssertionError("unreachable")


def exactness(model: Transformer, inputs: Inputs) -> dict:
    """Full recompute against rcllm (and cacheblend) at a 1.0 budget: the last position's
    final-normed hidden state must be the same (up to the dtype's rounding)."""
    out = {}
    _ms, full, _l = timed_prefill(model, inputs, Variant("full"))
    ref = model.final_hidden(full.hidden_last).float()
    for v in (Variant("rcllm", 1.0, 1.0), Variant("cacheblend", 1.0, 1.0)):
        _ms, res, _l = timed_prefill(model, inputs, v)
        got = model.final_hidden(res.hidden_last).float()
        out[v.method] = {
            "max_abs_diff": float((got - ref).abs().max()),
            "cosine": float(torch.nn.functional.cosine_similarity(got, ref, dim=0)),
            "recomputed_fraction": float(res.computed.float().mean()),
            "finite": bool(torch.isfinite(got).all())}
    return out


def _p(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)] if s else float("nan")


def measure(model: Transformer, tokens: Sequence[int], vs: Sequence[Variant], repeats: int,
            warmup: int = 1, seed: int = 0, log=None) -> tuple[list[dict], dict]:
    """Rows per (prompt length, variant) and the exactness check per prompt length."""
    rows, exact = [], {}
    for n in tokens:
        prompt = synthetic_prompt(n, model.arch.vocab_size, seed)
        inputs = Inputs(model, prompt, seed)
        exact[n] = exactness(model, inputs)   # untimed: meets the dtype bug first if any
        times: dict[str, list[float]] = {v.name: [] for v in vs}
        last: dict[str, object] = {}
        for rep in range(warmup + repeats):
            for v in vs:  # interleaved: drift hits every method alike
                ms, res, _logits = timed_prefill(model, inputs, v)
                if rep >= warmup:
                    times[v.name].append(ms)
                last[v.name] = res
        base = {}
        for v in vs:
            res = last[v.name]
            ts = times[v.name]
            have, exact_kv = inputs.masks[v.method]
            row = {"tokens": n, "method": v.method, "variant": v.name,
                   "item_ratio": v.item_ratio if v.method in ("cacheblend", "rcllm") else None,
                   "history_ratio": v.history_ratio if v.method == "rcllm" else None,
                   "ttft_p50_ms": statistics.median(ts), "ttft_p90_ms": _p(ts, 0.9),
                   "ttft_min_ms": min(ts), "repeats": len(ts),
                   "recomputed_tokens": int(res.computed.sum()),
                   "reused_tokens": int((have & ~exact_kv).sum()),
                   "prefix_tokens": int(exact_kv.sum()),
                   "recomputed_fraction": float(res.computed.float().mean()),
                   "flop_bound_speedup": res.full_flops / res.flops}
            base.setdefault(v.method, row)
            rows.append(row)
        for row in rows[-len(vs):]:
            full, pre = base.get("full"), base.get("prefix")
            row["speedup_vs_full"] = full["ttft_p50_ms"] / row["ttft_p50_ms"] if full else None
            row["speedup_vs_prefix"] = pre["ttft_p50_ms"] / row["ttft_p50_ms"] if pre else None
            row["measured_vs_flop_bound"] = (row["speedup_vs_full"] / row["flop_bound_speedup"]
                                             if full else None)
        exact[n]["default_dtype_workaround"] = inputs.default_dtype
        if log:
            log(n, rows[-len(vs):])
    return rows, exact


def fit_profile(rows: Sequence[dict], shape: Shape, model: Transformer, device_label: str):
    """A SpeedProfile fitted to the rows' p50s (computed = tokens computed at layers >= 1,
    context = prompt tokens), and the in-sample median relative error per method."""
    import numpy as np

    from ..routing.fit import fit_cpu_profile, predict_ms

    spec = dataclasses.replace(shape.spec, kv_dtype_bytes=int(model.dtype.itemsize))
    gpu = model.device.type == "cuda"
    base = SpeedProfile(
        name=f"{shape.name}@{device_label}", model=spec, fixed_ms=0.0, ms_per_token=0.0,
        ms_per_token_ctx=0.0, host_bytes_per_s=PCIE_BYTES_PER_S if gpu else math.inf,
        network_bytes_per_s=NETWORK_BYTES_PER_S, overlap_fraction=1.0 if gpu else 0.0,
        max_batch_tokens=8192 if gpu else 1)
    points = [(r["recomputed_tokens"], r["tokens"], r["ttft_p50_ms"]) for r in rows]
    methods = [r["method"] for r in rows]
    profile = fit_cpu_profile(points, methods, base=base)
    errors: dict[str, list[float]] = {}
    for r in rows:
        pred = float(predict_ms(profile, r["method"], np.array([r["recomputed_tokens"]]),
                                np.array([r["tokens"]]))[0])
        errors.setdefault(r["method"], []).append(abs(pred - r["ttft_p50_ms"]) / r["ttft_p50_ms"])
    return profile, {m: statistics.median(e) for m, e in errors.items()}


def device_label(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")
