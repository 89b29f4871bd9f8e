"""The cache look-ups of a request: every cache answers in one shape (`kvstore.base.KVMatch`),
and the matches are assembled into the prefill's inputs.

Order: the exact part first — the user side from the user-prefix cache (pointwise), else the
longest prefix from the prefix cache — then, after it, one chunk-store look-up per chunk
segment (a miss of a review may take prototype KV instead). Exact matches are copied into the
buffers here; reused ones are copied by the layer gather while the prefill runs, when
`reuse.overlap` is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import REUSE_METHODS, HistoryConfig, ReuseConfig
from ..kvstore.base import KVMatch, match_chunk
from ..model.transformer import Transformer
from ..prefill.chunks import ChunkBuilder
from ..prefill.prefix_cache import PrefixCache
from ..prefill.layout import Layout
from ..prefill.selective import Frozen, PrefillInputs
from ..prompt.builder import KINDS, Prompt
from .gather import LayerGather
from .records import SOURCES, RankStats


@dataclass
class Caches:
    """The caches a request reads (the engine's, handed over whole)."""

    prefix: PrefixCache
    chunks: ChunkBuilder
    library: object | None = None          # a prototypes.PrototypeLibrary, or None
    history: HistoryConfig = field(default_factory=HistoryConfig)


@dataclass
class Assembly:
    """What the look-ups give the prefill, the stats so far, and the chunk misses to build
    after the answer: (kind, token ids)."""

    inp: PrefillInputs
    stats: RankStats
    misses: list[tuple[str, tuple[int, ...]]]
    # `late`: the reused item slots computed from reuse.late_layer up (prefill's join)
    join: list[Frozen] = field(default_factory=list)


def exact_match(prompt: Prompt, reuse: ReuseConfig, user, caches: Caches, n: int,
                stats: RankStats, model: Transformer) -> KVMatch | None:
    """The exact KV the request starts with: the cached user side (a hit, or the base an
    append extends), else the prefix cache's longest prefix (not with "full")."""
    if user is not None and user.state != "miss":
        found = user.match(model.dtype, model.device)
        stats.user_prefix, stats.user_prefix_tokens = user.state, found.length
        return found
    if reuse.method == "full":
        return None
    # the shared part may end at the last slot (listwise) which must stay fresh
    limit = len(prompt) if prompt.blocks else n - 1
    found = caches.prefix.match(prompt.token_ids, limit)
    stats.prefix_tokens = found.length if found else 0
    if user is not None:
        stats.user_prefix = "miss"
    return found


def chunk_matches(prompt: Prompt, reuse: ReuseConfig, caches: Caches, after: int,
                  stats: RankStats) -> tuple[list[KVMatch], list]:
    """The chunk store's matches for every chunk segment starting at or after slot `after`
    (and prototype matches for review misses when a library is on); and the misses."""
    matches, misses = [], []
    if reuse.method not in REUSE_METHODS:
        return matches, misses
    library = caches.library if reuse.prototypes else None
    start = 0
    for seg in prompt.slot_segments():
        ids, at = seg.token_ids, start
        start += len(ids)
        if not seg.is_chunk or at < after:
            continue
        if reuse.method == "late" and seg.kind == "item" and reuse.late_layer == 0:
            continue  # every item token computed: nothing taken from the store
        tail = reuse.item_tail if seg.kind == "item" else 0  # a tail is computed in the prompt
        found = match_chunk(caches.chunks.store, caches.chunks.key(seg.kind, ids, reuse), ids,
                            tail)
        if found is not None:
            matches.append(found.at(at))
            stats.chunk_hits += 1
            stats.reused_tokens[seg.kind] += found.held
            continue
        stats.chunk_misses += 1
        misses.append((seg.kind, ids))
        if seg.kind == "history" and library is not None:
            proto = library.match(caches.chunks, ids, caches.history.threshold,
                                  caches.history.search).as_match().at(at)
            matches.append(proto)
            stats.prototype_chunks += 1
            stats.prototype_tokens += int(proto.held.sum())
    return matches, misses


def assemble(model: Transformer, prompt: Prompt, reuse: ReuseConfig, user, caches: Caches,
             head_rows: int | None) -> Assembly:
    """The request's prefill inputs: KV buffers of every slot, which slots hold cached KV
    (exact or reused) and where it came from."""
    a, dev = model.arch, model.device
    segments = prompt.slot_segments()
    ids = [t for seg in segments for t in seg.token_ids]
    n = len(ids)
    shape = (a.num_layers, a.num_kv_heads, n, a.head_dim)
    k_buf = torch.empty(shape, dtype=model.dtype, device=dev)
    v_buf = torch.empty(shape, dtype=model.dtype, device=dev)
    stats = RankStats(tokens=n, truncated_history=prompt.truncated_history)
    have = torch.zeros(n, dtype=torch.bool)
    source = torch.zeros(n, dtype=torch.int8)
    first = exact_match(prompt, reuse, user, caches, n, stats, model)
    done = first.length if first is not None else 0
    for s, e, k, v in first.copies() if first is not None else ():
        k_buf[:, :, s:e] = k
        v_buf[:, :, s:e] = v
    if first is not None:
        have[:done] = True
        source[:done] = SOURCES.index(first.source)
    exact = have.clone()
    # user_side "exact": the user side of a pointwise prompt reuses no chunk
    fresh_upto = len(prompt) if prompt.blocks and reuse.user_side == "exact" else 0
    reused, misses = chunk_matches(prompt, reuse, caches, max(done, fresh_upto), stats)
    for m in reused:
        held = m.held_mask()
        have[m.start:m.start + m.length] |= held
        source[m.start:m.start + m.length][held] = SOURCES.index(m.source)
    inp = _inputs(model, prompt, ids, k_buf, v_buf, have, exact, reuse, reused)
    inp.source, inp.head_rows = source, head_rows
    entries = {m.start: m.entry for m in reused if m.entry is not None}
    join = late_join(model, prompt, reuse, caches, inp, entries) if reuse.method == "late" else []
    return Assembly(inp, stats, misses, join)


def late_join(model: Transformer, prompt: Prompt, reuse: ReuseConfig, caches: Caches,
              inp: PrefillInputs, entries: dict | None = None) -> list[Frozen]:
    """`late`: every item slot holding store KV joins the computed slots at reuse.late_layer,
    with the state its chunk's own pass carried into that layer: the one its store entry
    carries (`entries`: first slot → `ChunkKV`; a build for `late` keeps it, through every
    tier), else recomputed (`ChunkBuilder.states`); none when the layer is past the model's
    last (naive reuse of the chunk)."""
    s = reuse.late_layer
    if not 0 < s < model.arch.num_layers:
        return []
    have = inp.have_kv.cpu()
    slots, states, start = [], [], 0
    for seg in prompt.slot_segments():
        at, start = start, start + len(seg.token_ids)
        if seg.kind != "item" or not bool(have[at:start].any()) or bool(inp.exact_kv[at]):
            continue
        held = int(have[at:start].sum())   # the store's part: the chunk but its tail
        slots.append(torch.arange(at, at + held))
        entry = (entries or {}).get(at)
        h = entry.states_at(s) if entry is not None else None
        if h is None:
            h = caches.chunks.states("item", seg.token_ids, s, reuse)
        states.append(h[:held])
    if not slots:
        return []
    return [Frozen(s, torch.cat(slots).to(model.device), torch.cat(states))]


def _inputs(model: Transformer, prompt: Prompt, ids: list[int], k_buf, v_buf, have, exact,
            reuse: ReuseConfig, reused: list[KVMatch]) -> PrefillInputs:
    """The prefill inputs over the buffers; the reused KV copied in, or gathered layer by
    layer beside the prefill (`reuse.overlap`)."""
    dev, n = model.device, len(ids)
    kind = torch.zeros(n, dtype=torch.int8)
    offset = torch.zeros(n, dtype=torch.long)
    start = 0
    for seg in prompt.slot_segments():
        end = start + len(seg.token_ids)
        kind[start:end] = KINDS.index(seg.kind)
        if seg.is_chunk:
            offset[start:end] = torch.arange(len(seg.token_ids))
        start = end
    layout = Layout(n, prompt.block_ranges(), dev)
    inp = PrefillInputs(torch.tensor(ids, device=dev), k_buf, v_buf, have.to(dev),
                        exact.to(dev), kind.to(dev), offset.to(dev), layout=layout)
    if reuse.overlap and reused:
        inp.layer = LayerGather(model, k_buf, v_buf, reused, layout.pos)
    else:
        for m in reused:
            for s, e, k, v in m.copies():
                k_buf[:, :, s:e] = k
                v_buf[:, :, s:e] = v
    return inp
