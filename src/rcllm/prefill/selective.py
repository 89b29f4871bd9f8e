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
from .selection import Probe, SelectionPolicy

MASS_QUERIES = 16  # last queries whose layer-0 attention defines the heavy hitters
GROUP_SLOTS = 1024  # block attention runs over groups of whole blocks of at most this many slots


class Layout:
    """Positions and visibility of N KV slots.

    Slots [0, shared) form one causal sequence at positions 0..shared-1. Each block (a slot
    range after the shared part) restarts at position `shared` and sees the shared part plus
    itself causally. `outputs` are the slots whose hidden states the prefill returns (sorted;
    default: each block's last slot, or the last slot).
    """

    def __init__(self, n: int, blocks: Sequence[tuple[int, int]] = (), device=None,
                 outputs: torch.Tensor | None = None):
        self.n = n
        self.blocks = list(blocks)
        self.shared = self.blocks[0][0] if self.blocks else n
        pos = torch.arange(n, device=device)
        block = torch.zeros(n, dtype=torch.long, device=device)
        prev = self.shared
        for b, (s, e) in enumerate(self.blocks, start=1):
            if s != prev or e <= s:
                raise ValueError("blocks must be consecutive, non-empty and end the layout")
            pos[s:e] = torch.arange(self.shared, self.shared + e - s, device=device)
            block[s:e] = b
            prev = e
        if prev != n:
            raise ValueError("blocks must cover the slots after the shared part")
        self.pos, self.block = pos, block
        if outputs is None:
            outputs = (torch.tensor([e - 1 for _, e in self.blocks], device=device)
                       if self.blocks else torch.tensor([n - 1], device=device))
        self.outputs = outputs
        self._groups: list[tuple[int, int]] = []
        for s, e in self.blocks:  # consecutive whole blocks of <= GROUP_SLOTS slots
            if self._groups and e - self._groups[-1][0] <= GROUP_SLOTS:
                self._groups[-1] = (self._groups[-1][0], e)
            else:
                self._groups.append((s, e))

    @staticmethod
    def causal(n: int, device=None) -> "Layout":
        return Layout(n, (), device)

    @staticmethod
    def after(shared: int, lengths: Sequence[int], device=None, every_slot: bool = False
              ) -> "Layout":
        """A shared part of `shared` slots, then one block per length; outputs: each block's
        last slot, or with every_slot all block slots."""
        blocks, at = [], shared
        for k in lengths:
            blocks.append((at, at + k))
            at += k
        outputs = torch.arange(shared, at, device=device) if every_slot else None
        return Layout(at, blocks, device, outputs)

    def visible(self, q_slots: torch.Tensor) -> torch.Tensor:
        """[len(q_slots), N] bool: which slots each query slot attends to."""
        qp, qb = self.pos[q_slots].unsqueeze(1), self.block[q_slots].unsqueeze(1)
        return (self.pos.unsqueeze(0) <= qp) & ((self.block.unsqueeze(0) == 0)
                                                | (self.block.unsqueeze(0) == qb))

    def plan(self, idx: torch.Tensor) -> list[tuple[int, int, int, int, torch.Tensor | None]]:
        """How queries at slots `idx` (sorted) attend: (query from, to, key slots from, to,
        mask) per call; mask None = the shared part's causal attention."""
        out = []
        cut = int(torch.searchsorted(idx, torch.tensor(self.shared, device=idx.device)))
        if cut:
            out.append((0, cut, 0, self.shared, None))
        for s, e in self._groups:
            a = int(torch.searchsorted(idx, torch.tensor(s, device=idx.device)))
            b = int(torch.searchsorted(idx, torch.tensor(e, device=idx.device)))
            if b > a:
                q = idx[a:b]
                keys = torch.cat((torch.arange(self.shared, device=idx.device),
                                  torch.arange(s, e, device=idx.device)))
                mask = ((self.pos[keys].unsqueeze(0) <= self.pos[q].unsqueeze(1))
                        & ((self.block[keys].unsqueeze(0) == 0)
                           | (self.block[keys].unsqueeze(0) == self.block[q].unsqueeze(1))))
                out.append((a, b, s, e, mask))
        return out


def attend_layout(model: Transformer, q_rot: torch.Tensor, idx: torch.Tensor,
                  k_rot: torch.Tensor, v: torch.Tensor, layout: Layout, plan) -> torch.Tensor:
    """Attention of the queries at slots idx [n] (rotated [H, n, D]) over every slot's rotated
    keys / values [H_kv, N, D] as the layout allows. Returns [H, n, D]."""
    if not layout.blocks:
        return model.attend(q_rot, idx, k_rot, v)
    gqa = model.arch.num_heads != model.arch.num_kv_heads
    parts = []
    for a, b, s, e, mask in plan:
        if mask is None:
            parts.append(model.attend(q_rot[:, a:b], idx[a:b], k_rot[:, :e], v[:, :e]))
            continue
        keys = torch.cat((k_rot[:, :layout.shared], k_rot[:, s:e]), dim=1)
        vals = torch.cat((v[:, :layout.shared], v[:, s:e]), dim=1)
        parts.append(torch.nn.functional.scaled_dot_product_attention(
            q_rot[:, a:b].unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0), attn_mask=mask,
            enable_gqa=gqa).squeeze(0))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


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
    from .selection import SelectionPolicy

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
    inp = PrefillInputs(ids, bufs(k), bufs(v), have, have.clone(),
                        torch.zeros(total, dtype=torch.int8, device=dev),
                        torch.zeros(total, dtype=torch.long, device=dev), layout=layout)
    return prefill(model, inp, SelectionPolicy(None), grad=grad).hidden_out


def prefill(model: Transformer, inp: PrefillInputs, policy: SelectionPolicy,
            grad: bool = False) -> PrefillResult:
    """Runs the selective prefill; mutates inp.k_buf/v_buf into the prompt's final KV.

    grad=True keeps the autograd graph (fine-tuning); k_buf / v_buf may then be per-layer
    lists, so that writing one layer's KV never invalidates a tensor an earlier layer saved.
    """
    with nullcontext() if grad else torch.inference_mode():
        return _prefill(model, inp, policy)


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


def _prefill(model: Transformer, inp: PrefillInputs, policy: SelectionPolicy) -> PrefillResult:
    t0 = time.perf_counter()
    n = inp.ids.shape[0]
    if n == 0:
        raise ValueError("empty prompt")
    a, layout = model.arch, inp.layout
    if not bool((~inp.have_kv)[layout.outputs].all()):
        raise ValueError("every output slot must be fresh (it produces a score)")
    st = _layer0_and_probe(model, inp, policy)
    idx, h, flops, found = st.idx, st.h, st.flops, st.found
    computed = torch.zeros(n, dtype=torch.bool, device=h.device)
    computed[idx] = True
    plan = layout.plan(idx)
    t1 = time.perf_counter()
    counts = []
    for layer in range(1, a.num_layers):
        if layer > 1 and found is not None:
            keep = policy.layer_set(inp, (layer - 1) / max(1, a.num_layers - 2), idx, found)
            if keep is not None and not bool(keep.all()):
                idx, h = idx[keep], h[keep]
                plan = layout.plan(idx)
        h = _layer(model, layer, h, idx, inp, plan, st.qkv1 if layer == 1 else None)
        flops += _layer_flops(model, layout, idx)
        counts.append(len(idx))
    flops += _head_flops(model, layout, inp.head_rows)
    rows = torch.searchsorted(idx, layout.outputs)
    t2 = time.perf_counter()
    mass = None
    if found is not None:
        mass = found.mass1 if found.mass1 is not None else found.mass
    return PrefillResult(h[rows], computed, int(st.layer0.sum()), flops,
                         _full_flops(model, layout, inp.head_rows),
                         found.deviation if found else None, mass,
                         (t1 - t0) * 1e3, (t2 - t1) * 1e3, tuple(counts))


def _qkv_flops(model: Transformer) -> float:
    a = model.arch
    return 2 * a.hidden_size * (a.num_heads + 2 * a.num_kv_heads) * a.head_dim
