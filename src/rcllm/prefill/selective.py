"""Selective prefill: reused KV for most tokens, recomputation for the few that matter.

Given N assembled tokens where some slots already hold KV (exact prefix blocks, or reused
chunks computed in another context) and the rest are fresh:

1. Layer 0 runs on the fresh tokens and the reused ones the policy may pick (every non-exact
   token for cacheblend; rcllm's window tokens only when its budget fits in the windows) when
   the policy asks for a probe; its output feeds layer 1's K/V projections, compared with the
   cached layer-1 K/V → a *deviation* per probed token; layer-0 attention of the last queries
   gives the attention *mass* each token receives (layer-0 K/V of a reused token are exact:
   they depend on the token alone, so the mass needs no probe of that token).
2. The policy picks the tokens to recompute; fresh tokens are always computed.
3. Layers ≥ 1 compute only the chosen tokens: their new K/V overwrite the reused ones, their
   queries attend causally over all N keys (reused keys are rotated to their new positions).
   A policy whose budget shrinks with depth drops tokens between layers (`layer_set`); a
   dropped token keeps its reused KV in the layers above.
4. Only the output slots' hidden states are returned (logits are the caller's choice).

With a policy that selects every token this is exactly full recompute.

One loop serves every prompt shape through a `Layout`: which position each KV slot sits at and
which earlier slots it sees. The listwise prompt is one causal sequence. The pointwise prompt is
a shared part (the user side) followed by C candidate *blocks* that all start right after it,
each seeing the shared part and itself, never another block; each block's last slot is an
output. Fine-tuning runs the same loop with gradients (`grad=True`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..model.transformer import Transformer
from .layout import Layout, attend_layout
from .selection import Probe, SelectionPolicy

MASS_QUERIES = 16  # last queries whose layer-0 attention defines the heavy hitters


@dataclass
class PrefillInputs:
    ids: torch.Tensor        # [N] token ids
    k_buf: torch.Tensor      # [L, H_kv, N, D] pre-RoPE keys; valid where have_kv
    v_buf: torch.Tensor      # [L, H_kv, N, D]
    have_kv: torch.Tensor    # [N] bool: slot holds cached KV (exact or reused)
    exact_kv: torch.Tensor   # [N] bool: cached KV is exact (prefix blocks): never recomputed
    kind: torch.Tensor       # [N] int8 codes of prompt.builder.KINDS
    offset: torch.Tensor     # [N] int: position inside its chunk (0 for non-chunk tokens)
    # Overlap (engine's reuse.overlap): layer(l) blocks until k_buf[l]/v_buf[l] hold the reused
    # KV and returns layer l's keys already rotated to their positions (the gather thread
    # rotates them while earlier layers compute), or None when nothing was prepared.
    layer: Callable[[int], torch.Tensor | None] | None = None
    layout: Layout | None = None  # None: one causal sequence (slot index == position)
    source: torch.Tensor | None = None  # [N] int8 codes of engine.SOURCES (explain only)
    # rows of the output head the scorer computes per output slot (FLOP accounting only):
    # None = the whole vocabulary; the pointwise scorer reads two (" Yes", " No")
    head_rows: int | None = None

    def __post_init__(self):
        if self.layout is None:
            self.layout = Layout.causal(self.ids.shape[0], self.ids.device)


@dataclass
class PrefillResult:
    hidden_out: torch.Tensor           # [K, d] the layout's output slots, before the final norm
    computed: torch.Tensor             # [N] bool: computed at layer 1 (a shrinking policy
                                       # computes subsets of it in the layers above)
    layer0_computed: int               # tokens computed at layer 0
    flops: float                       # FLOPs actually done
    full_flops: float                  # FLOPs of a full recompute of the same prompt
    deviation: torch.Tensor | None = None   # [N] the probe's layer-1 KV deviation (reused slots)
    mass: torch.Tensor | None = None        # [N] the probe's attention mass (when read)
    layer0_ms: float = 0.0             # layer 0 (with the probe and the selection)
    layers_ms: float = 0.0             # layers >= 1 over the selected tokens
    layer_tokens: tuple[int, ...] = ()  # tokens computed at each layer >= 1
    frozen: "Frozen | None" = None      # prefill(capture=layer): the states entering it

    @property
    def hidden_last(self) -> torch.Tensor:
        """[d] the last output slot (the listwise prompt's last position)."""
        return self.hidden_out[-1]


def _deviation(k: torch.Tensor, v: torch.Tensor, k_old: torch.Tensor, v_old: torch.Tensor,
               idx: torch.Tensor, reused: torch.Tensor) -> torch.Tensor:
    """[n] float32 L2 distance between the new K/V [H_kv, n, D] of slots idx and the K/V the
    buffers hold there; 0 where `reused` [n] is False (a fresh slot's buffer is garbage)."""
    dk = (k - k_old[:, idx]).pow(2).sum(dim=(0, 2))
    dv = (v - v_old[:, idx]).pow(2).sum(dim=(0, 2))
    dev = (dk + dv).float().sqrt()
    return torch.where(reused, dev, torch.zeros_like(dev))


def _layer(model: Transformer, layer: int, h: torch.Tensor, idx: torch.Tensor,
           inp: PrefillInputs, plan, qkv=None, seen=None) -> torch.Tensor:
    """The model's layer body over the slots idx: their K/V written into the buffers, queries
    attending over every slot's KV as the layout allows."""
    pos = inp.layout.pos
    q_pos = pos[idx]

    def keys(k, v):
        # wait for the gather first: it writes this layer's reused KV, which the recomputed
        # slots then overwrite
        k_rot = inp.layer(layer) if inp.layer is not None else None
        inp.k_buf[layer][:, idx] = k
        inp.v_buf[layer][:, idx] = v
        if k_rot is None:
            return model.rope(inp.k_buf[layer], pos), inp.v_buf[layer]
        k_rot[:, idx] = model.rope(k, q_pos)  # reused keys arrive rotated
        return k_rot, inp.v_buf[layer]

    def attend(q_rot, k_rot, v):
        return attend_layout(model, q_rot, idx, k_rot, v, inp.layout, plan)

    return model.layer(layer, h, q_pos, keys, attend, qkv, seen)[0]


def _attention_mass(model: Transformer, q: torch.Tensor, idx: torch.Tensor,
                    k_rot: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Attention probability mass each key receives from the last MASS_QUERIES queries (with
    blocks: each block's answer slot) among the queries q [H, n, D] at slots idx: [N]."""
    a = model.arch
    if layout.blocks:
        rows = torch.searchsorted(idx, layout.outputs)  # outputs are fresh: always queried
    else:
        rows = torch.arange(max(0, len(idx) - MASS_QUERIES), len(idx), device=idx.device)
    qs = q[:, rows]
    k = k_rot.repeat_interleave(a.num_heads // a.num_kv_heads, dim=0)   # [H, N, D]
    scores = torch.matmul(qs, k.transpose(1, 2)) * model.scale()      # [H, q, N]
    scores.masked_fill_(~layout.visible(idx[rows]), float("-inf"))
    return torch.softmax(scores.float(), dim=-1).sum(dim=(0, 1))


def _layer_flops(model: Transformer, layout: Layout, idx: torch.Tensor) -> float:
    """FLOPs of one layer over the slots idx: linear layers, and attention over the p + 1 keys
    a slot at position p sees (in every layout: blocks start right after the shared part)."""
    a = model.arch
    pairs = float((layout.pos[idx] + 1).sum())
    return (a.params_per_token_flops() * len(idx) + a.attention_flops(1) * pairs) / a.num_layers


def _head_flops(model: Transformer, layout: Layout, head_rows: int | None) -> float:
    """FLOPs of the output head over the layout's output slots (head_rows None: every row)."""
    a = model.arch
    return 2 * a.hidden_size * (head_rows or a.vocab_size) * len(layout.outputs)


def _full_flops(model: Transformer, layout: Layout, head_rows: int | None = None) -> float:
    """FLOPs of a full recompute of the layout, output logits included."""
    a = model.arch
    head = _head_flops(model, layout, head_rows)
    every = torch.arange(layout.n, device=layout.pos.device)
    return _layer_flops(model, layout, every) * a.num_layers + head


def continue_exact(model: Transformer, k: torch.Tensor, v: torch.Tensor,
                   blocks: Sequence[Sequence[int]], grad: bool = False,
                   every_slot: bool = False) -> torch.Tensor:
    """Hidden states (before the final norm) of token blocks placed right after an exact KV
    prefix k/v [L, H_kv, N, D] (keys pre-RoPE), each block seeing the prefix and itself only:
    each block's last slot [C, d], or with every_slot all block slots [sum, d]. The prefix is
    not modified. One pass of the selective prefill with nothing to select."""
    inp = _after_exact(model, k, v, blocks, every_slot)
    return prefill(model, inp, SelectionPolicy(None), grad=grad).hidden_out


def blocks_kv(model: Transformer, k: torch.Tensor, v: torch.Tensor,
              blocks: Sequence[Sequence[int]], states_at: int | None = None,
              states: list | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(K, V) [L, H_kv, len(block), D] (keys pre-RoPE) of each token block placed right after
    an exact KV prefix k/v, seeing the prefix and itself only: what one forward of the block
    after the prefix gives (`Transformer.forward(block, k, v, return_kv=True)`), for every
    block in one pass of the selective prefill, so the weights are read once for all of them.
    With `states_at`, the same pass also appends to `states` each block's hidden states
    entering that layer ([len(block), d]: what the `late` method starts from)."""
    inp = _after_exact(model, k, v, blocks, False)
    res = prefill(model, inp, SelectionPolicy(None), capture=states_at)
    out, at = [], k.shape[2]
    for b in blocks:
        out.append((torch.stack([kb[:, at:at + len(b)] for kb in inp.k_buf]),
                    torch.stack([vb[:, at:at + len(b)] for vb in inp.v_buf])))
        if states_at is not None and states is not None:
            want = torch.arange(at, at + len(b), device=res.frozen.idx.device)
            states.append(res.frozen.h[torch.searchsorted(res.frozen.idx, want)])
        at += len(b)
    return out


def block_states(model: Transformer, k: torch.Tensor, v: torch.Tensor,
                 blocks: Sequence[Sequence[int]], layer: int) -> list[torch.Tensor]:
    """The hidden states [len(block), d] entering `layer` of each token block placed right
    after an exact KV prefix k/v, seeing the prefix and itself only: what a chunk's tokens carry
    into that layer in the pass that builds its KV (the `late` method joins them there)."""
    states: list = []
    blocks_kv(model, k, v, blocks, layer, states)
    return states


def _after_exact(model: Transformer, k: torch.Tensor, v: torch.Tensor,
                 blocks: Sequence[Sequence[int]], every_slot: bool) -> PrefillInputs:
    """Prefill inputs of blocks after an exact prefix: the prefix's KV held, the blocks to
    compute, a block layout (`continue_exact`, `blocks_kv`)."""
    if any(len(b) == 0 for b in blocks):
        raise ValueError("empty block")
    n, dev = k.shape[2], model.device
    layout = Layout.after(n, [len(b) for b in blocks], dev, every_slot)
    total = layout.n
    ids = torch.cat((torch.zeros(n, dtype=torch.long, device=dev),
                     torch.tensor([t for b in blocks for t in b], device=dev)))
    a = model.arch

    def bufs(prefix):
        out = []
        for layer in range(a.num_layers):
            buf = prefix.new_empty(a.num_kv_heads, total, a.head_dim)
            buf[:, :n] = prefix[layer]
            out.append(buf)
        return out

    have = torch.zeros(total, dtype=torch.bool, device=dev)
    have[:n] = True
    return PrefillInputs(ids, bufs(k), bufs(v), have, have.clone(),
                         torch.zeros(total, dtype=torch.int8, device=dev),
                         torch.zeros(total, dtype=torch.long, device=dev), layout=layout)


@dataclass
class Frozen:
    """The hidden states [n, d] entering layer `layer` of the slots idx [n] a probe-free
    prefill computes there. When the layers below never change (fine-tuning from a first layer
    on), they are a function of the prompt alone: `prefill(..., capture=layer)` records them and
    `prefill(..., start=frozen)` runs only the layers from `layer` on, over the same inputs,
    exactly (the KV buffers below `layer` are then neither read nor written)."""

    layer: int
    idx: torch.Tensor
    h: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.h.numel() * self.h.element_size() + self.idx.numel() * 8


def prefill(model: Transformer, inp: PrefillInputs, policy: SelectionPolicy,
            grad: bool = False, start: Frozen | None = None,
            capture: int | None = None, join: Sequence[Frozen] = (),
            stop: int | None = None) -> PrefillResult:
    """Runs the selective prefill; mutates inp.k_buf/v_buf into the prompt's final KV.

    grad=True keeps the autograd graph (fine-tuning); k_buf / v_buf may then be per-layer
    lists, so that writing one layer's KV never invalidates a tensor an earlier layer saved.
    `start` / `capture` (probe-free policies only, layer >= 1): see `Frozen`; the captured
    states come back in `PrefillResult.frozen`. `stop` (probe-free): only the layers below it
    run; `frozen` holds the states entering it, graph kept, and no output slot is read.
    `join` (probe-free policies only): reused slots that are computed from a layer on — the
    late interaction of `late_joint`: each `Frozen(layer, idx, h)` adds the slots idx, with
    their states h entering that layer (from the pass that built their KV), to the computed
    slots from `layer` up; below it they keep the KV the buffers hold.
    """
    if (start is not None or capture is not None or stop or join) and policy.needs_probe:
        raise ValueError("start/capture/stop/join need a policy without a probe (its slots "
                         "never change)")
    for layer in (start.layer if start is not None else None, capture, stop):
        if layer is not None and not 1 <= layer < model.arch.num_layers:
            raise ValueError(f"start/capture/stop layer {layer} is not within 1..num_layers-1")
    for j in join:
        if not 1 <= j.layer < model.arch.num_layers or not bool(inp.have_kv[j.idx].all()):
            raise ValueError(f"join layer {j.layer} must be within 1..num_layers-1 and its "
                             "slots must hold reused KV")
    with nullcontext() if grad else torch.inference_mode():
        return _prefill(model, inp, policy, start, capture, join, stop)


@dataclass
class _Start:
    """What layer 0 and the probe hand to layers >= 1."""
    idx: torch.Tensor          # [n] slots computed at layer 1 (sorted)
    h: torch.Tensor            # [n, d] their hidden states after layer 0
    layer0: torch.Tensor       # [N] bool: slots computed at layer 0
    flops: float               # layer 0, plus the probe's layer-1 projections left unused
    qkv1: tuple | None = None  # layer 1's projections of idx, made by the probe
    found: Probe | None = None  # the probe's scores (None: the policy did not probe)


def _layer0_and_probe(model: Transformer, inp: PrefillInputs, policy: SelectionPolicy
                      ) -> _Start:
    n, layout, pos_all = inp.ids.shape[0], inp.layout, inp.layout.pos
    fresh = ~inp.have_kv
    reused = inp.have_kv & ~inp.exact_kv
    probe = policy.needs_probe and bool(reused.any())
    probed = None
    if probe:  # layer 0 over the fresh tokens and the reused ones the policy may pick
        probed = policy.probe_set(inp)
        probed = reused if probed is None else probed & reused
    layer0 = (fresh | probed) if probe else (fresh | policy.static_set(inp))
    idx = torch.nonzero(layer0).squeeze(1)
    h = model.embed(inp.ids[idx])
    for layer in (0, 1) if inp.layer is not None else ():
        inp.layer(layer)  # the probe reads layers 0 and 1 whole (unrotated copies suffice)
    heavy = []  # layer-0 heavy hitters, read from the layer's rotated queries and keys

    def seen(q_rot, k_rot):
        if probe and 0 in policy.mass_layers():
            heavy.append(_attention_mass(model, q_rot, idx, k_rot, layout))

    h = _layer(model, 0, h, idx, inp, layout.plan(idx), seen=seen)
    mass = heavy[0] if heavy else None
    out = _Start(idx, h, layer0, _layer_flops(model, layout, idx))
    if not probe:
        return out
    q1, k1, v1 = model.qkv(1, h)
    dev = torch.zeros(n, device=h.device)
    dev[idx] = _deviation(k1, v1, inp.k_buf[1], inp.v_buf[1], idx, reused[idx])
    mass1 = None
    if 1 in policy.mass_layers():
        # layer-1 heavy hitters: the answer queries over layer-1 keys as the probe made them
        k1_all = inp.k_buf[1].clone()
        k1_all[:, idx] = k1
        mass1 = _attention_mass(model, model.rope(q1, pos_all[idx]), idx,
                                model.rope(k1_all, pos_all), layout)
    out.found = Probe(dev, mass, mass1, probed)
    keep = (policy.select(inp, out.found) | fresh)[idx]
    # the probe's layer-1 projections of the tokens it did not choose are extra work
    out.flops += _qkv_flops(model) * int((~keep).sum())
    out.idx, out.h = idx[keep], h[keep]
    out.qkv1 = (q1[:, keep], k1[:, keep].contiguous(), v1[:, keep].contiguous())
    return out


def _joined(idx: torch.Tensor, h: torch.Tensor, j: Frozen) -> tuple[torch.Tensor, torch.Tensor]:
    """The computed slots idx (sorted) and their states h with j's slots and states added."""
    both = torch.cat((idx, j.idx.to(idx.device)))
    order = torch.argsort(both)
    return both[order], torch.cat((h, j.h.to(h.dtype))).index_select(0, order)


def _prefill(model: Transformer, inp: PrefillInputs, policy: SelectionPolicy,
             start: Frozen | None = None, capture: int | None = None,
             join: Sequence[Frozen] = (), stop: int | None = None) -> PrefillResult:
    t0 = time.perf_counter()
    n = inp.ids.shape[0]
    if n == 0:
        raise ValueError("empty prompt")
    a, layout = model.arch, inp.layout
    if not bool((~inp.have_kv)[layout.outputs].all()):
        raise ValueError("every output slot must be fresh (it produces a score)")
    if start is None:
        st = _layer0_and_probe(model, inp, policy)
        first = 1
    else:
        st = _Start(start.idx, start.h, torch.zeros(n, dtype=torch.bool, device=start.h.device),
                    0.0)
        st.layer0[start.idx] = True
        first = start.layer
    idx, h, flops, found = st.idx, st.h, st.flops, st.found
    computed = torch.zeros(n, dtype=torch.bool, device=h.device)
    computed[idx] = True
    plan = layout.plan(idx)
    t1 = time.perf_counter()
    counts, frozen = [], None
    for layer in range(first, stop or a.num_layers):
        for j in join:
            if j.layer == layer:
                idx, h = _joined(idx, h, j)
                plan = layout.plan(idx)
        if layer == capture:
            frozen = Frozen(layer, idx, h.detach())
        if layer > 1 and found is not None:
            keep = policy.layer_set(inp, (layer - 1) / max(1, a.num_layers - 2), idx, found)
            if keep is not None and not bool(keep.all()):
                idx, h = idx[keep], h[keep]
                plan = layout.plan(idx)
        h = _layer(model, layer, h, idx, inp, plan, st.qkv1 if layer == 1 else None)
        flops += _layer_flops(model, layout, idx)
        counts.append(len(idx))
    if stop is not None:   # the states entering `stop`, graph kept; nothing read out
        return PrefillResult(h[:0], computed, int(st.layer0.sum()), flops,
                             _full_flops(model, layout, inp.head_rows),
                             layer_tokens=tuple(counts), frozen=Frozen(stop, idx, h))
    flops += _head_flops(model, layout, inp.head_rows)
    rows = torch.searchsorted(idx, layout.outputs)
    t2 = time.perf_counter()
    mass = None
    if found is not None:
        mass = found.mass1 if found.mass1 is not None else found.mass
    return PrefillResult(h[rows], computed, int(st.layer0.sum()), flops,
                         _full_flops(model, layout, inp.head_rows),
                         found.deviation if found else None, mass,
                         (t1 - t0) * 1e3, (t2 - t1) * 1e3, tuple(counts), frozen)


def _qkv_flops(model: Transformer) -> float:
    a = model.arch
    return 2 * a.hidden_size * (a.num_heads + 2 * a.num_kv_heads) * a.head_dim
