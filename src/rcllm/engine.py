"""The single-process engine: request → prompt → cache look-ups → selective prefill → scorer.

The engine owns the model, the prompt builder, the chunk store (any `KVStore`), the prefix
cache and (pointwise scorer) the user-prefix cache. `rank()` is the request path; everything it
times is on the path to the first token. Chunk misses are computed fresh inside the request
and, after the answer, their position-independent KV is built and stored (off the timed path);
so is the user side of a pointwise request.

Scorers are strategy objects (`Scorer`): they build the prompt (the listwise sequence, or the
pointwise user side + one block per candidate) and turn the prefill's output slots into
scores. Every prompt goes through the one selective prefill (`prefill.selective`).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import torch

from .config import RcllmConfig, ReuseConfig
from .errors import RcllmError
from .kvstore.base import ChunkKV, KVStore, MemoryLRUStore, chunk_key
from .model.loading import LoadedModel
from .prefill.prefix_cache import PrefixCache
from .prefill.scoring import continuation_scores, verbalizer_scores, yes_no_logits
from .prefill.selection import selection_policy
from .prefill.selective import Layout, PrefillInputs, prefill
from .prompt.builder import KINDS, Prompt, PromptBuilder, RankRequest
from .records import HistoryEntry, Item, ItemId

log = logging.getLogger(__name__)
REUSE_METHODS = ("naive", "cacheblend", "epic", "rcllm")  # methods that reuse chunk KV
# where a slot's KV came from before the prefill (explain): fresh = computed in the request
SOURCES = ("fresh", "prefix", "user_prefix", "chunk", "prototype")
# verbalizer / likelihood: the listwise prompt; pointwise: the rcllm.userprefix yes/no prompt
# with every candidate scored after the one selectively prefilled user side
SCORERS = ("verbalizer", "likelihood", "pointwise")


@dataclass
class RankStats(Mapping):
    """What one request did: sizes, cache look-ups, recomputation, FLOPs and where the time
    went. Reads like a mapping (`stats["chunk_hits"]`, `dict(stats)`) for reports and JSON."""

    tokens: int = 0                  # KV slots of the prompt (with blocks: user side + blocks)
    prefix_tokens: int = 0           # exact tokens from the prefix cache
    user_prefix: str = "off"         # pointwise: hit | append | miss | off (user-prefix cache)
    user_prefix_tokens: int = 0      # exact tokens from the user-prefix cache
    chunk_hits: int = 0
    chunk_misses: int = 0
    reused_tokens: dict = field(default_factory=lambda: {"history": 0, "item": 0})
    prototype_tokens: int = 0
    prototype_chunks: int = 0
    recomputed_tokens: int = 0
    recomputed_fraction: float = 0.0  # of the slots computed at layer 1 (the deepest set)
    # tokens computed at each layer >= 1 (a depth schedule shrinks them) and their mean share of
    # the slots over those layers: what the FLOPs follow, where recomputed_fraction is layer 1's
    layer_tokens: tuple = ()
    mean_recomputed_fraction: float = 0.0
    recomputed_by_kind: dict = field(default_factory=dict)
    tokens_by_kind: dict = field(default_factory=dict)
    layer0_tokens: int = 0
    flops: float = 0.0
    full_flops: float = 0.0
    truncated_history: int = 0
    build_ms: float = 0.0            # prompt build + tokenise
    assemble_ms: float = 0.0         # cache look-ups + KV gather
    prefill_ms: float = 0.0          # prefill + first-token scoring

    def __getitem__(self, name: str):
        if name not in self._names():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


@dataclass
class RankResult:
    ranking: list[ItemId]            # best first
    scores: dict[ItemId, float]      # log-scores (higher is better)
    method: str
    ttft_ms: float                   # request arrival → first-token logits
    total_ms: float                  # including likelihood scoring where used
    stats: RankStats = field(default_factory=RankStats)
    # kept when asked: [V] logits of the last position and its final-normed hidden state [d];
    # with the pointwise scorer each candidate's (yes, no) logits [C, 2] and hidden [C, d]
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    # rank(explain=True): every token with the source of its KV and what the selection did,
    # and the TTFT in parts (see Engine.explain)
    explain: dict | None = None


class LayerGather:
    """Copies reused chunk KV into the prompt's buffers layer by layer in a thread, and rotates
    each layer's keys to their prompt positions, while the prefill computes earlier layers
    (`reuse.overlap`). Calling it with a layer blocks until that layer is ready and returns its
    rotated keys [H_kv, N, D]; a failure in the thread is raised there, never swallowed."""

    def __init__(self, model, k_buf: torch.Tensor, v_buf: torch.Tensor, copies: list,
                 positions: torch.Tensor):
        self._ready = [threading.Event() for _ in range(k_buf.shape[0])]
        self._rotated: list[torch.Tensor | None] = [None] * k_buf.shape[0]
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run,
                                        args=(model, k_buf, v_buf, copies, positions),
                                        name="rcllm-kv-gather", daemon=True)
        self._thread.start()

    def _run(self, model, k_buf, v_buf, copies, positions) -> None:
        try:
            with torch.inference_mode():
                for layer, ready in enumerate(self._ready):
                    for s, e, entry in copies:
                        k_buf[layer, :, s:e] = entry.k[layer]
                        v_buf[layer, :, s:e] = entry.v[layer]
                    if layer:  # the prefill rotates layer 0 itself
                        self._rotated[layer] = model.rope(k_buf[layer], positions)
                    ready.set()
        except BaseException as exc:  # surfaced to the prefill by __call__
            self._error = exc
            for ready in self._ready:
                ready.set()

    def __call__(self, layer: int) -> torch.Tensor:
        self._ready[layer].wait()
        if self._error is not None:
            raise RuntimeError("gathering reused KV failed") from self._error
        return self._rotated[layer]


@dataclass(frozen=True)
class UserSideLookup:
    key: str
    user_id: str
    history_hash: str
    entries: int                     # history entries the user side holds
    tokens: int                      # its length (the shared part ends with the block head)
    entry: object | None             # the cached user side (CachedPrefix) or None: a miss
    base: object | None = None       # on a miss: the user's entry for a prefix of the history


class Scorer(abc.ABC):
    """A ranking strategy: builds the prompt of a request (through `source`, a PromptBuilder
    or a PointwisePrompt) and turns the prefill's output slots into one score per candidate
    (higher is better)."""

    name = ""
    head_rows: int | None = None  # output-head rows score() computes (None: the vocabulary)

    def __init__(self, source):
        self.source = source

    def prompt(self, req: RankRequest) -> Prompt:
        return self.source.build(req)

    def context_ids(self, kind: str) -> tuple[int, ...]:
        """Instruction + the dynamic text a chunk of `kind` is built after (its KV context)."""
        extra = () if kind == "instruction" else tuple(self.source.context_ids(kind))
        return tuple(self.source.instruction_ids) + extra

    @abc.abstractmethod
    def score(self, engine: "Engine", prompt: Prompt, inp: PrefillInputs, hidden_out):
        """(scores [C], logits, normed hidden) from the output slots' hidden states."""

    def after_first_token(self, engine: "Engine", prompt: Prompt, inp: PrefillInputs,
                          scores: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Work after the first token that still decides the ranking (likelihood)."""
        return scores


class ListwiseScorer(Scorer):
    """The listwise prompt; the verbalizer reads the candidate labels at the last position."""

    name = "verbalizer"

    def score(self, engine, prompt, inp, hidden_out):
        logits = engine.model.logits(hidden_out[-1])
        return verbalizer_scores(logits, prompt.label_token_ids), logits, None


class LikelihoodScorer(ListwiseScorer):
    """The listwise prompt; each candidate's name as the continuation, scored after the first
    token (its cost is in total_ms, not in the TTFT)."""

    name = "likelihood"

    def score(self, engine, prompt, inp, hidden_out):
        logits = engine.model.logits(hidden_out[-1])
        return None, logits, None

    def after_first_token(self, engine, prompt, inp, scores, logits):
        conts = [self.source.continuation_ids(c) for c in prompt.candidates]
        return continuation_scores(engine.model, inp.k_buf, inp.v_buf, logits, conts)


class PointwiseScorer(Scorer):
    """The user side, then one block per candidate (head + item chunk + tail) in one packed
    pass; score = the " Yes" − " No" logit at each block's last slot (TALLRec)."""

    name = "pointwise"
    head_rows = 2  # the " Yes" and " No" rows only

    def __init__(self, builder: PromptBuilder, max_positions: int):
        from .userprefix.prompt import PointwisePrompt

        super().__init__(PointwisePrompt(builder, max_positions))
        self.pw = self.source

    def score(self, engine, prompt, inp, hidden_out):
        hidden = engine.model.final_hidden(hidden_out)
        logits = yes_no_logits(engine.model, hidden, self.pw.yes_id, self.pw.no_id)
        return logits[:, 0] - logits[:, 1], logits, hidden


def make_scorer(name: str, builder: PromptBuilder, max_positions: int) -> Scorer:
    if name == "pointwise":
        return PointwiseScorer(builder, max_positions)
    return LikelihoodScorer(builder) if name == "likelihood" else ListwiseScorer(builder)


class Engine:
    def __init__(self, loaded: LoadedModel, catalog: Mapping[ItemId, Item], cfg: RcllmConfig,
                 store: KVStore | None = None, scorer: str = "verbalizer"):
        self.loaded = loaded
        self.model = loaded.model
        self.cfg = cfg
        if scorer not in SCORERS:
            raise RcllmError(f"unknown scorer {scorer!r}; use one of {', '.join(SCORERS)}")
        self.scorer = scorer
        self.catalog = catalog
        # the pointwise scorer keeps the listwise builder for chunk texts and validation
        self.builder = PromptBuilder(loaded.tokenizer, catalog, cfg.prompt,
                                     self.model.arch.max_positions,
                                     "verbalizer" if scorer == "pointwise" else scorer)
        self.strategy = make_scorer(scorer, self.builder, self.model.arch.max_positions)
        self.pointwise = getattr(self.strategy, "pw", None)
        self.store: KVStore = store if store is not None else MemoryLRUStore(cfg.reuse.store_bytes)
        self.prefix = PrefixCache(loaded.fingerprint, cfg.reuse.prefix_block)
        instr_ids = self.strategy.context_ids("instruction")
        out = self.model.forward(torch.tensor(instr_ids, device=self.model.device),
                                 return_kv=True)
        self.prefix.insert(instr_ids, out["k"], out["v"], len(instr_ids))
        self.user_prefixes = None
        if self.pointwise is not None:
            from .userprefix.cache import UserPrefixCache

            self.user_prefixes = UserPrefixCache(cfg.userprefix.cache_config(),
                                                 loaded.fingerprint)
        # KV of the context each chunk kind is built after (see compute_chunk)
        self._contexts: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor, str]] = {}
        self.history_library = None
        if cfg.history.library:
            from .prototypes import PrototypeLibrary

            self.history_library = PrototypeLibrary.load(
                cfg.history.library, loaded.fingerprint, self.kind_tag("history"))

    # ---- chunk KV -----------------------------------------------------------------------
    def _context(self, kind: str, mode: str):
        """(K, V, tag) of the tokens a chunk of `kind` is built after, or None for "none".

        "instruction": the instruction prefix; "template": the instruction followed by the
        dynamic text that precedes such a chunk in a prompt (the items header and a label, or
        the pointwise block head; a history entry's bullet), so the chunk's first tokens see a
        realistic neighbourhood instead of acting as attention sinks.
        """
        if mode == "none":
            return None
        if (kind, mode) not in self._contexts:
            ids = list(self.strategy.context_ids("instruction" if mode == "instruction" else kind))
            out = self.model.forward(torch.tensor(ids, device=self.model.device), return_kv=True)
            tag = hashlib.sha256(repr(ids).encode()).hexdigest()[:12]
            self._contexts[(kind, mode)] = (out["k"], out["v"], tag)
        return self._contexts[(kind, mode)]

    def _kind_tag(self, kind: str, reuse: ReuseConfig) -> str:
        ctx = self._context(kind, reuse.chunk_context)
        return f"{kind}@{ctx[2] if ctx else 'none'}"

    def kind_tags(self) -> dict[str, str]:
        """The tag of each chunk kind under the engine's configured chunk context."""
        return {kind: self.kind_tag(kind) for kind in ("history", "item")}

    def kind_tag(self, kind: str) -> str:
        """The tag chunks of `kind` are keyed under (kind + the context they are built after)."""
        return self._kind_tag(kind, self.cfg.reuse)

    def context_layer0(self, kind: str):
        """Layer-0 (K, V) [H_kv, P, D] of the context chunks of `kind` are built after, or None."""
        ctx = self._context(kind, self.cfg.reuse.chunk_context)
        return (ctx[0][0], ctx[1][0]) if ctx else None

    def chunk_key(self, kind: str, ids: Sequence[int], reuse: ReuseConfig | None = None):
        return chunk_key(self.loaded.fingerprint, self._kind_tag(kind, reuse or self.cfg.reuse), ids)

    @torch.inference_mode()
    def compute_chunk(self, kind: str, ids: Sequence[int],
                      reuse: ReuseConfig | None = None) -> ChunkKV:
        """Position-independent KV of a chunk, built after its kind's context (keys pre-RoPE)."""
        ctx = self._context(kind, (reuse or self.cfg.reuse).chunk_context)
        t = torch.tensor(ids, device=self.model.device)
        out = self.model.forward(t, ctx[0] if ctx else None, ctx[1] if ctx else None,
                                 return_kv=True)
        return ChunkKV(tuple(ids), out["k"], out["v"])

    def ensure_chunk(self, kind: str, ids: Sequence[int], reuse: ReuseConfig | None = None) -> bool:
        """Builds and stores the chunk if absent; returns True when it was built. On a store
        with `build_now` (kvstore.front.StoreFront) a build of the same key in flight is
        joined, not repeated."""
        key = self.chunk_key(kind, ids, reuse)
        if self.store.contains(key):
            return False
        build_now = getattr(self.store, "build_now", None)
        if build_now is not None:
            return build_now(key, lambda: self.compute_chunk(kind, ids, reuse))
        self.store.put(key, self.compute_chunk(kind, ids, reuse))
        return True

    def build_items(self, item_ids: Iterable[ItemId], progress: bool = False) -> int:
        return self._build("item", [self.builder.item_chunk(i) for i in item_ids], progress)

    def build_history(self, entries: Iterable[HistoryEntry], progress: bool = False) -> int:
        return self._build("history", [self.builder.history_chunk(e) for e in entries], progress)

    def _build(self, kind: str, chunks: list[tuple[int, ...]], progress: bool) -> int:
        from tqdm import tqdm

        built = 0
        bar = tqdm(chunks, desc=f"building {kind} KV", unit="chunk", disable=not progress)
        for ids in bar:
            built += self.ensure_chunk(kind, ids)
        return built

    # ---- request path -------------------------------------------------------------------
    def reuse_config(self, req: RankRequest, method: str | None, **overrides) -> ReuseConfig:
        merged = {**dict(req.overrides), **overrides}
        if method:
            merged["method"] = method
        known = {f.name for f in dataclasses.fields(ReuseConfig)}
        unknown = set(merged) - known
        if unknown:
            raise RcllmError(f"unknown override {sorted(unknown)[0]!r}")
        reuse = dataclasses.replace(self.cfg.reuse, **merged)
        reuse.validate()
        return reuse

    def _user_prefix(self, req: RankRequest, prompt: Prompt, reuse: ReuseConfig):
        """The request's user side in the user-prefix cache (entry None on a miss), or None
        when the cache does not apply (listwise, full/prefix methods, turned off)."""
        if (self.user_prefixes is None or not reuse.user_prefix
                or reuse.method not in REUSE_METHODS):
            return None
        from .userprefix.prompt import history_hash

        kept = tuple(req.history)[prompt.truncated_history:]
        cache = self.user_prefixes
        cache.note_request(req.user_id)
        hhash = history_hash(kept)
        key = cache.key(req.user_id, hhash)
        exact = reuse.user_side != "reuse"  # only entries built exactly may serve
        entry = cache.lookup(key, exact=exact)
        base = None
        if entry is None:  # an earlier, shorter history of this user: its user side is a prefix
            base = cache.latest(req.user_id, exact=exact)
            # appends in a row are bounded (INT8 error accumulates): then a full compute
            if base is not None and not (base.entries < len(kept) and
                                         base.appends < cache.cfg.refresh_every and
                                         history_hash(kept[:base.entries]) == base.history_hash):
                base = None
        tokens = len(prompt) - len(self.pointwise.head_ids)  # the shared part less the head
        return UserSideLookup(key, req.user_id, hhash, len(kept), tokens, entry, base)

    def _assemble(self, prompt: Prompt, reuse: ReuseConfig, user):
        """Cache look-ups: the KV buffers of every slot, which slots hold cached KV (exact or
        reused), and the chunk misses to build after answering."""
        a = self.model.arch
        segments = prompt.slot_segments()
        ids = [t for seg in segments for t in seg.token_ids]
        n, shared = len(ids), len(prompt)
        dev = self.model.device
        shape = (a.num_layers, a.num_kv_heads, n, a.head_dim)
        k_buf = torch.empty(shape, dtype=self.model.dtype, device=dev)
        v_buf = torch.empty(shape, dtype=self.model.dtype, device=dev)
        have = torch.zeros(n, dtype=torch.bool)
        kind = torch.zeros(n, dtype=torch.int8)
        offset = torch.zeros(n, dtype=torch.long)
        stats = RankStats(tokens=n, truncated_history=prompt.truncated_history)
        prefix_len = 0
        cached = user and (user.entry or user.base)
        if cached:
            kv = cached.stored.load(self.model.dtype, dev)
            prefix_len = kv.k.shape[2]
            if prefix_len > user.tokens:
                raise RuntimeError("a cached user side longer than the request's")
            k_buf[:, :, :prefix_len] = kv.k
            v_buf[:, :, :prefix_len] = kv.v
            stats.user_prefix = "hit" if user.entry is not None else "append"
            stats.user_prefix_tokens = prefix_len
        elif reuse.method != "full":
            # the shared part may end at the last slot (listwise) which must stay fresh
            limit = shared if prompt.blocks else n - 1
            prefix_len = self.prefix.lookup(prompt.token_ids, k_buf, v_buf, limit=limit)
            stats.prefix_tokens = prefix_len
            if user is not None:
                stats.user_prefix = "miss"
        have[:prefix_len] = True
        exact = have.clone()
        source = torch.zeros(n, dtype=torch.int8)
        source[:prefix_len] = SOURCES.index("user_prefix" if cached else "prefix")
        library = self.history_library if reuse.prototypes else None
        # user_side "exact": the user side of a pointwise prompt reuses no chunk
        fresh_upto = shared if prompt.blocks and reuse.user_side == "exact" else 0
        misses, copies = [], []
        start = 0
        for seg in segments:
            end = start + len(seg.token_ids)
            kind[start:end] = KINDS.index(seg.kind)
            if seg.is_chunk:
                offset[start:end] = torch.arange(len(seg.token_ids))
                if reuse.method in REUSE_METHODS and start >= max(prefix_len, fresh_upto):
                    entry = self.store.get(self.chunk_key(seg.kind, seg.token_ids, reuse))
                    if entry is not None and entry.token_ids == seg.token_ids:
                        copies.append((start, end, entry))
                        # an item tail stays fresh: computed seeing the user side
                        upto = end - (reuse.item_tail if seg.kind == "item" else 0)
                        upto = max(start, upto)
                        have[start:upto] = True
                        source[start:upto] = SOURCES.index("chunk")
                        stats.chunk_hits += 1
                        stats.reused_tokens[seg.kind] += upto - start
                    else:
                        stats.chunk_misses += 1
                        misses.append((seg.kind, seg.token_ids))
                        if seg.kind == "history" and library is not None:
                            m = library.match(self, seg.token_ids, self.cfg.history.threshold,
                                              self.cfg.history.search)
                            copies.append((start, end, ChunkKV(seg.token_ids, m.k, m.v)))
                            have[start:end] = m.matched
                            source[start:end][m.matched.cpu()] = SOURCES.index("prototype")
                            stats.prototype_chunks += 1
                            stats.prototype_tokens += int(m.matched.sum())
            start = end
        layout = Layout(n, prompt.block_ranges(), dev)
        inp = PrefillInputs(torch.tensor(ids, device=dev), k_buf, v_buf, have.to(dev),
                            exact.to(dev), kind.to(dev), offset.to(dev), layout=layout)
        if reuse.overlap and copies:
            inp.layer = LayerGather(self.model, k_buf, v_buf, copies, layout.pos)
        else:
            for s, e, entry in copies:
                k_buf[:, :, s:e] = entry.k
                v_buf[:, :, s:e] = entry.v
        inp.source = source
        inp.head_rows = self.strategy.head_rows
        return inp, stats, misses

    def rank(self, req: RankRequest, method: str | None = None, keep_tensors: bool = False,
             explain: bool = False, **overrides) -> RankResult:
        """Ranks req.candidates; raises RcllmError for bad input. Thread-compatible, not
        thread-safe (one request at a time per engine)."""
        t0 = time.perf_counter()
        reuse = self.reuse_config(req, method, **overrides)
        prompt = self.strategy.prompt(req)
        t1 = time.perf_counter()
        user = self._user_prefix(req, prompt, reuse)
        inp, stats, misses = self._assemble(prompt, reuse, user)
        t2 = time.perf_counter()
        res = prefill(self.model, inp, selection_policy(reuse))
        t3 = time.perf_counter()
        with torch.inference_mode():
            scores_t, logits, hidden = self.strategy.score(self, prompt, inp, res.hidden_out)
        if logits.is_cuda:  # the clock stops when the first token's logits exist, not sooner
            torch.cuda.synchronize(logits.device)
        ttft_ms = (time.perf_counter() - t0) * 1e3
        with torch.inference_mode():
            scores_t = self.strategy.after_first_token(self, prompt, inp, scores_t, logits)
        total_ms = (time.perf_counter() - t0) * 1e3
        scores = {c: float(s) for c, s in zip(prompt.candidates, scores_t)}
        ranking = sorted(prompt.candidates, key=lambda c: -scores[c])
        self._after(reuse, prompt, inp, misses, user)
        kinds = inp.kind.cpu()
        computed = res.computed.cpu()
        stats.recomputed_tokens = int(computed.sum())
        stats.recomputed_fraction = float(computed.float().mean())
        layers = stats.layer_tokens = tuple(res.layer_tokens)
        stats.mean_recomputed_fraction = (sum(layers) / (len(layers) * len(computed)) if layers
                                          else stats.recomputed_fraction)
        stats.recomputed_by_kind = {k: int((computed & (kinds == KINDS.index(k))).sum())
                                    for k in KINDS}
        stats.tokens_by_kind = {k: int((kinds == KINDS.index(k)).sum()) for k in KINDS}
        stats.layer0_tokens = res.layer0_computed
        stats.flops, stats.full_flops = res.flops, res.full_flops
        stats.build_ms, stats.assemble_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        stats.prefill_ms = ttft_ms - (t2 - t0) * 1e3
        result = RankResult(ranking, scores, reuse.method, ttft_ms, total_ms, stats)
        if explain:
            result.explain = self._explain(prompt, inp, res, {
                "build": stats.build_ms, "lookups_and_gather": stats.assemble_ms,
                "layer0_and_selection": res.layer0_ms, "selective_layers": res.layers_ms,
                "scoring": ttft_ms - (t3 - t0) * 1e3})
        if keep_tensors:
            result.logits = logits.detach()
            result.hidden = (hidden if hidden is not None
                             else self.model.final_hidden(res.hidden_last)).detach()
        return result

    def _explain(self, prompt: Prompt, inp: PrefillInputs, res, timing: dict) -> dict:
        """Token by token: text, segment kind, block (0 = shared, i = the i-th candidate's),
        the source of its KV, whether the selection recomputed it (layers 1..L-1; layer 0 runs
        on every non-exact token when the method probes) and the probe's deviation and
        attention mass; and the TTFT in parts (ms). Only what the request path computed."""
        tok = self.loaded.tokenizer
        ids = inp.ids.tolist()
        texts = tok.convert_ids_to_tokens(ids)
        kinds = inp.kind.tolist()
        blocks = inp.layout.block.tolist()
        computed = res.computed.tolist()
        have = inp.have_kv.tolist()
        exact = inp.exact_kv.tolist()
        src = inp.source.tolist()
        dev = res.deviation.tolist() if res.deviation is not None else None
        mass = res.mass.tolist() if res.mass is not None else None
        last = self.model.arch.num_layers - 1
        tokens = []
        for i, t in enumerate(ids):
            reused = have[i] and not exact[i]
            tokens.append({
                "id": t, "text": tok.convert_tokens_to_string([texts[i]]),
                "kind": KINDS[kinds[i]], "block": blocks[i], "source": SOURCES[src[i]],
                "recomputed": bool(reused and computed[i]),
                "layers": [0 if not exact[i] and (dev is not None or not have[i]) else 1, last]
                if computed[i] else ([0, 0] if dev is not None and not exact[i] else None),
                "deviation": dev[i] if dev is not None and reused else None,
                "attention": mass[i] if mass is not None else None})
        return {"tokens": tokens, "candidates": list(prompt.candidates),
                "timing_ms": timing, "sources": list(SOURCES)}

    def prewarm(self, user_id: str, history: Sequence[HistoryEntry]) -> dict:
        """Pre-inference (RelayGR): computes the user's pointwise user side exactly and stores
        it in the user-prefix cache, so the user's next ranking hits. RcllmError when the
        engine has no user-prefix cache (a listwise scorer) or the history is too long."""
        if self.user_prefixes is None:
            raise RcllmError("prewarm needs the pointwise scorer (the user-prefix cache)")
        from .userprefix.entry import CachedPrefix
        from .userprefix.kv import StoredKV
        from .userprefix.prompt import history_hash
        from .userprefix.scoring import compute_prefix

        window = self.cfg.prompt.history_window
        kept = tuple(history)[-window:] if window else ()
        side = self.pointwise.user_side(user_id, kept)
        key = self.user_prefixes.key(user_id, history_hash(kept))
        if self.user_prefixes.lookup(key, count=False, exact=True) is not None:
            return {"tokens": len(side.ids), "computed": False}
        kv = compute_prefix(self.model, side.ids)
        self.user_prefixes.put(CachedPrefix(key, user_id, side.history_hash, len(kept), 0,
                                            StoredKV.of(kv, self.user_prefixes.cfg.int8),
                                            exact=True))
        return {"tokens": len(side.ids), "computed": True}

    def _after(self, reuse: ReuseConfig, prompt: Prompt, inp: PrefillInputs, misses,
               user) -> None:
        """After the answer: exact prompts feed the prefix cache, misses feed the store (built
        on the store's builder thread when it has one, so the response does not wait), a
        pointwise user side feeds the user-prefix cache."""
        shared = len(prompt)
        if reuse.prefix_insert and reuse.method in ("full", "prefix"):
            upto = shared if prompt.blocks else shared - 1
            self.prefix.insert(prompt.token_ids, inp.k_buf, inp.v_buf, upto)
        # misses: built behind the answer, once per key, on a store that can (StoreFront)
        behind = getattr(self.store, "build_behind", None)
        count_miss = getattr(self.store, "count_miss", None)
        for kind, ids in misses:
            if reuse.cache_misses and behind is not None:
                behind(self.chunk_key(kind, ids, reuse), kind,
                       lambda kind=kind, ids=ids: self.compute_chunk(kind, ids, reuse))
            elif reuse.cache_misses:
                self.ensure_chunk(kind, ids, reuse)
            elif count_miss is not None:
                count_miss(kind)
        if user is not None and user.entry is None:
            self._store_user_side(reuse, inp, user)

    def _store_user_side(self, reuse: ReuseConfig, inp: PrefillInputs, user) -> None:
        """A user-prefix miss: its user side into the cache. Stored as served, marked exact
        when no reused KV went into it (its base, if any, exact too); under user_side "behind"
        an approximate one is replaced by the exact user side computed after the answer (an
        append to an exact base, else one causal forward), on the store's builder thread when
        it has one and misses are built (`reuse.cache_misses`)."""
        from .userprefix.append import append_prefix
        from .userprefix.entry import CachedPrefix
        from .userprefix.kv import PrefixKV, StoredKV
        from .userprefix.scoring import compute_prefix

        n, base, cache = user.tokens, user.base, self.user_prefixes
        served_exact = (bool((inp.exact_kv[:n] | ~inp.have_kv[:n]).all())
                        and (base is None or base.exact))
        appends = base.appends + 1 if base is not None else 0
        if served_exact or reuse.user_side != "behind":
            kv = PrefixKV(inp.k_buf[:, :, :n].clone(), inp.v_buf[:, :, :n].clone())
            cache.put(CachedPrefix(user.key, user.user_id, user.history_hash, user.entries,
                                   appends, StoredKV.of(kv, cache.cfg.int8), exact=served_exact))
            return
        ids = inp.ids[:n].tolist()

        def build() -> None:  # under "behind" a base is exact (_user_prefix asks for one)
            if base is not None:
                past = base.stored.load(self.model.dtype, self.model.device)
                kv, count = append_prefix(self.model, past, ids[past.tokens:]), appends
            else:
                kv, count = compute_prefix(self.model, ids), 0
            cache.put(CachedPrefix(user.key, user.user_id, user.history_hash, user.entries,
                                   count, StoredKV.of(kv, cache.cfg.int8), exact=True))

        # on the store's builder thread when misses are built behind the answer (serve), so
        # the worker takes its next request at once; else here, off the clock (bench, eval)
        behind = getattr(self.store, "run_behind", None)
        if reuse.cache_misses and behind is not None:
            behind(f"user-side:{user.key}", build)
        else:
            build()
