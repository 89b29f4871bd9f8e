"""The single-process engine: request → prompt → cache lookup → selective prefill → ranking.

The engine owns the model, the prompt builder, the chunk store (any `KVStore`) and the
prefix cache. `rank()` is the request path; everything it times is on the path to the first
token. Chunk misses are computed fresh inside the request and, after the answer, their
position-independent KV is built and stored (off the timed path).
"""

from __future__ import annotations

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
from .prompt.builder import KINDS, Prompt, PromptBuilder, RankRequest
from .records import HistoryEntry, Item, ItemId
from .prefill.selective import PrefillInputs, prefill
from .prefill.prefix_cache import PrefixCache
from .prefill.scoring import continuation_scores, verbalizer_scores
from .prefill.selection import selection_policy
from .userprefix.scoring import suffix_last_hidden, yes_no_logits

log = logging.getLogger(__name__)
REUSE_METHODS = ("naive", "cacheblend", "epic", "rcllm")  # methods that reuse chunk KV
# verbalizer / likelihood: the listwise prompt; pointwise: the rcllm.userprefix yes/no prompt
# with every candidate scored after the one selectively prefilled user side
SCORERS = ("verbalizer", "likelihood", "pointwise")


@dataclass
class RankResult:
    ranking: list[ItemId]            # best first
    scores: dict[ItemId, float]      # log-scores (higher is better)
    method: str
    ttft_ms: float                   # request arrival → first-token logits
    total_ms: float                  # including likelihood scoring where used
    stats: dict = field(default_factory=dict)
    # kept when asked: [V] logits of the last position and its final-normed hidden state [d];
    # with the pointwise scorer each candidate's (yes, no) logits [C, 2] and hidden [C, d]
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


class LayerGather:
    """Copies reused chunk KV into the prompt's buffers layer by layer in a thread, and rotates
    each layer's keys to their prompt positions, while the prefill computes earlier layers
    (`reuse.overlap`). Calling it with a layer blocks until that layer is ready and returns its
    rotated keys [H_kv, N, D]; a failure in the thread is raised there, never swallowed."""

    def __init__(self, model, k_buf: torch.Tensor, v_buf: torch.Tensor, copies: list):
        self._ready = [threading.Event() for _ in range(k_buf.shape[0])]
        self._rotated: list[torch.Tensor | None] = [None] * k_buf.shape[0]
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(model, k_buf, v_buf, copies),
                                        name="rcllm-kv-gather", daemon=True)
        self._thread.start()

    def _run(self, model, k_buf, v_buf, copies) -> None:
        try:
            with torch.inference_mode():
                positions = torch.arange(k_buf.shape[2], device=k_buf.device)
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
        # the pointwise scorer keeps the listwise builder for chunk texts and contexts
        self.builder = PromptBuilder(loaded.tokenizer, catalog, cfg.prompt,
                                     self.model.arch.max_positions,
                                     "verbalizer" if scorer == "pointwise" else scorer)
        self.pointwise = None
        if scorer == "pointwise":
            from .userprefix.prompt import PointwisePrompt

            self.pointwise = PointwisePrompt(self.builder, self.model.arch.max_positions)
        self.store: KVStore = store or MemoryLRUStore(cfg.reuse.store_bytes)
        self.prefix = PrefixCache(loaded.fingerprint, cfg.reuse.prefix_block)
        instr_ids = (self.pointwise.instruction_ids if self.pointwise is not None
                     else self.builder.instruction_ids)
        out = self.model.forward(torch.tensor(instr_ids, device=self.model.device),
                                 return_kv=True)
        self.prefix.insert(instr_ids, out["k"], out["v"], len(instr_ids))
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
        dynamic text that precedes such a chunk in a prompt (the items header and a label, or a
        history entry's date and rating), so the chunk's first tokens see a realistic
        neighbourhood instead of acting as attention sinks.
        """
        if mode == "none":
            return None
        if (kind, mode) not in self._contexts:
            ids = list(self.builder.instruction_ids)
            if mode == "template":
                ids += list(self.builder.context_ids(kind))
            out = self.model.forward(torch.tensor(ids, device=self.model.device), return_kv=True)
            tag = hashlib.sha256(repr(ids).encode()).hexdigest()[:12]
            self._contexts[(kind, mode)] = (out["k"], out["v"], tag)
        return self._contexts[(kind, mode)]

    def _kind_tag(self, kind: str, reuse: ReuseConfig) -> str:
        ctx = self._context(kind, reuse.chunk_context)
        return f"{kind}@{ctx[2] if ctx else 'none'}"

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
        """Builds and stores the chunk if absent; returns True when it was built."""
        key = self.chunk_key(kind, ids, reuse)
        if self.store.contains(key):
            return False
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

    def _assemble(self, prompt: Prompt, reuse: ReuseConfig):
        a = self.model.arch
        ids = prompt.token_ids
        n = len(ids)
        dev = self.model.device
        shape = (a.num_layers, a.num_kv_heads, n, a.head_dim)
        k_buf = torch.empty(shape, dtype=self.model.dtype, device=dev)
        v_buf = torch.empty(shape, dtype=self.model.dtype, device=dev)
        have = torch.zeros(n, dtype=torch.bool)
        kind = torch.zeros(n, dtype=torch.int8)
        offset = torch.zeros(n, dtype=torch.long)
        prefix_len = 0
        if reuse.method != "full":
            prefix_len = self.prefix.lookup(ids, k_buf, v_buf, limit=n - 1)
            have[:prefix_len] = True
        exact = have.clone()
        stats = {"tokens": n, "prefix_tokens": prefix_len, "chunk_hits": 0, "chunk_misses": 0,
                 "reused_tokens": {"history": 0, "item": 0}, "prototype_tokens": 0,
                 "prototype_chunks": 0}
        library = self.history_library if reuse.prototypes else None
        misses, copies = [], []
        start = 0
        for seg in prompt.segments:
            end = start + len(seg.token_ids)
            kind[start:end] = KINDS.index(seg.kind)
            if seg.is_chunk:
                offset[start:end] = torch.arange(len(seg.token_ids))
                if reuse.method in REUSE_METHODS and start >= prefix_len:
                    entry = self.store.get(self.chunk_key(seg.kind, seg.token_ids, reuse))
                    if entry is not None and entry.token_ids == seg.token_ids:
                        copies.append((start, end, entry))
                        have[start:end] = True
                        stats["chunk_hits"] += 1
                        stats["reused_tokens"][seg.kind] += len(seg.token_ids)
                    else:
                        stats["chunk_misses"] += 1
                        misses.append((seg.kind, seg.token_ids))
                        if seg.kind == "history" and library is not None:
                            m = library.match(self, seg.token_ids, self.cfg.history.threshold,
                                              self.cfg.history.search)
                            copies.append((start, end, ChunkKV(seg.token_ids, m.k, m.v)))
                            have[start:end] = m.matched
                            stats["prototype_chunks"] += 1
                            stats["prototype_tokens"] += int(m.matched.sum())
            start = end
        inp = PrefillInputs(torch.tensor(ids, device=dev), k_buf, v_buf, have.to(dev),
                            exact.to(dev), kind.to(dev), offset.to(dev))
        if reuse.overlap and copies:
            inp.layer = LayerGather(self.model, k_buf, v_buf, copies)
        else:
            for s, e, entry in copies:
                k_buf[:, :, s:e] = entry.k
                v_buf[:, :, s:e] = entry.v
        return inp, stats, misses

    def rank(self, req: RankRequest, method: str | None = None, keep_tensors: bool = False,
             **overrides) -> RankResult:
        """Ranks req.candidates; raises RcllmError for bad input. Thread-compatible, not
        thread-safe (one request at a time per engine)."""
        t0 = time.perf_counter()
        reuse = self.reuse_config(req, method, **overrides)
        pw = self.pointwise
        if pw is None:
            prompt = self.builder.build(req)
        else:
            prompt, suffixes = pw.prompt(req)
        t1 = time.perf_counter()
        inp, stats, misses = self._assemble(prompt, reuse)
        t2 = time.perf_counter()
        res = prefill(self.model, inp, selection_policy(reuse))
        if pw is not None:
            # every candidate's title + question tail after the (selectively) prefilled user
            # side; its first answer token is the request's first token
            with torch.inference_mode():
                h = suffix_last_hidden(self.model, inp.k_buf, inp.v_buf, suffixes)
                logits = yes_no_logits(self.model, h, pw.yes_id, pw.no_id)    # [C, 2]
                hidden = self.model.final_hidden(h)
            scores_t = logits[:, 0] - logits[:, 1]
        else:
            logits = self.model.logits(res.hidden_last)
            hidden = None
        ttft_ms = (time.perf_counter() - t0) * 1e3
        if self.scorer == "likelihood":
            conts = [self.builder.continuation_ids(c) for c in prompt.candidates]
            scores_t = continuation_scores(self.model, inp.k_buf, inp.v_buf, logits, conts)
        elif self.scorer == "verbalizer":
            scores_t = verbalizer_scores(logits, prompt.label_token_ids)
        total_ms = (time.perf_counter() - t0) * 1e3
        scores = {c: float(s) for c, s in zip(prompt.candidates, scores_t)}
        ranking = sorted(prompt.candidates, key=lambda c: -scores[c])
        self._after(reuse, prompt, inp, res, misses)
        kinds = inp.kind.cpu()
        computed = res.computed.cpu()
        stats.update({
            "recomputed_tokens": int(computed.sum()),
            "recomputed_fraction": float(computed.float().mean()),
            "recomputed_by_kind": {k: int((computed & (kinds == KINDS.index(k))).sum())
                                   for k in KINDS},
            "tokens_by_kind": {k: int((kinds == KINDS.index(k)).sum()) for k in KINDS},
            "layer0_tokens": res.layer0_computed,
            "flops": res.flops, "full_flops": res.full_flops,
            "truncated_history": prompt.truncated_history,
            # where the time went: prompt build + tokenise, cache lookup + KV gather, prefill
            "build_ms": (t1 - t0) * 1e3, "assemble_ms": (t2 - t1) * 1e3,
            "prefill_ms": ttft_ms - (t2 - t0) * 1e3,
        })
        result = RankResult(ranking, scores, reuse.method, ttft_ms, total_ms, stats)
        if keep_tensors:
            result.logits = logits.detach()
            result.hidden = (hidden if hidden is not None
                             else self.model.final_hidden(res.hidden_last)).detach()
        return result

    def _after(self, reuse: ReuseConfig, prompt: Prompt, inp: PrefillInputs, res, misses) -> None:
        """Off the timed path: exact prompts feed the prefix cache, misses feed the store."""
        if reuse.prefix_insert and reuse.method in ("full", "prefix"):
            self.prefix.insert(prompt.token_ids, inp.k_buf, inp.v_buf, len(inp.ids) - 1)
        if reuse.cache_misses:
            for kind, ids in misses:
                self.ensure_chunk(kind, ids, reuse)

