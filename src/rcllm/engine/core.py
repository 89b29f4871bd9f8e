"""The engine core: one rank request as its phases.

    prompt (scorer) → cache look-ups (user side, prefix, chunk store, prototypes)
      → selective prefill → scores (scorer) → stored after the answer

Everything `rank` times is on the path to the first token. Chunk misses are computed fresh
inside the request and, after the answer, their position-independent KV is built and stored
(behind the answer on a store with a builder thread); so is the user side of a pointwise
request. The engine owns the model, the prompt builder, the chunk store (any `KVStore`), the
prefix cache and (pointwise scorer) the user sides; each phase lives in its own module.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Iterable, Mapping, Sequence

import torch

from ..config import METHOD_ALIASES, RcllmConfig, ReuseConfig
from ..errors import RcllmError
from ..kvstore.base import ChunkKV, KVStore, MemoryLRUStore
from ..model.adapter_file import ranks_untuned
from ..model.loading import LoadedModel
from ..prefill.chunks import ChunkBuilder
from ..prefill.prefix_cache import PrefixCache
from ..prefill.selection import selection_policy
from ..prefill.selective import prefill
from ..prompt.builder import Prompt, PromptBuilder, RankRequest
from ..records import HistoryEntry, Item, ItemId
from .explain import explain as explain_request
from .lookups import Assembly, Caches, assemble
from .records import RankResult, thread_run_wait_ns
from .scorers import SCORERS, make_scorer

log = logging.getLogger(__name__)


class Engine:
    """Ranks requests on one model. Thread-compatible, not thread-safe: one request at a time
    per engine (serve gives each worker its own)."""

    def __init__(self, loaded: LoadedModel, catalog: Mapping[ItemId, Item], cfg: RcllmConfig,
                 store: KVStore | None = None, scorer: str = "verbalizer"):
        if scorer not in SCORERS:
            raise RcllmError(f"unknown scorer {scorer!r}; use one of {', '.join(SCORERS)}")
        self.loaded, self.model, self.cfg = loaded, loaded.model, cfg
        self.scorer, self.catalog = scorer, catalog
        # the pointwise scorer keeps the listwise builder for chunk texts and validation
        self.builder = PromptBuilder(loaded.tokenizer, catalog, cfg.prompt,
                                     self.model.arch.max_positions,
                                     "verbalizer" if scorer == "pointwise" else scorer)
        self.strategy = make_scorer(scorer, self.builder, self.model.arch.max_positions)
        self.pointwise = getattr(self.strategy, "pw", None)
        self.store: KVStore = store if store is not None else MemoryLRUStore(cfg.reuse.store_bytes)
        self.chunks = ChunkBuilder(self.model, loaded.fingerprint, self.strategy.context_ids,
                                   cfg.reuse, self.store)
        self.prefix = PrefixCache(loaded.fingerprint, cfg.reuse.prefix_block)
        instr_ids = self.strategy.context_ids("instruction")
        out = self.model.forward(torch.tensor(instr_ids, device=self.model.device),
                                 return_kv=True)
        self.prefix.insert(instr_ids, out["k"], out["v"], len(instr_ids))
        self.user_sides = self.user_prefixes = None
        if self.pointwise is not None:
            from ..userprefix.side import UserSides

            self.user_sides = UserSides(self.model, self.pointwise, cfg.userprefix,
                                        loaded.fingerprint, cfg.prompt.history_window)
            self.user_prefixes = self.user_sides.cache
        self.history_library = None
        if cfg.history.library:
            from ..prototypes import PrototypeLibrary

            self.history_library = PrototypeLibrary.load(
                cfg.history.library, loaded.fingerprint, self.kind_tag("history"))
        self.caches = Caches(self.prefix, self.chunks, self.history_library, cfg.history)

    @property
    def untuned(self) -> bool:
        """True when no adapter is merged, or the one merged learnt nothing: the rankings are
        the base model's (report.UNTUNED_NOTE)."""
        return ranks_untuned(self.cfg.model.adapter)

    # ---- chunk KV (prefill.chunks) --------------------------------------------------------
    def kind_tags(self) -> dict[str, str]:
        """The tag of each chunk kind under the engine's configured chunk context."""
        return {kind: self.kind_tag(kind) for kind in ("history", "item")}

    def kind_tag(self, kind: str) -> str:
        return self.chunks.kind_tag(kind)

    def chunk_key(self, kind: str, ids: Sequence[int], reuse: ReuseConfig | None = None):
        return self.chunks.key(kind, ids, reuse)

    def compute_chunk(self, kind: str, ids: Sequence[int],
                      reuse: ReuseConfig | None = None) -> ChunkKV:
        return self.chunks.compute(kind, ids, reuse)

    def build_items(self, item_ids: Iterable[ItemId], progress: bool = False) -> int:
        return self.chunks.build("item", [self.builder.item_chunk(i) for i in item_ids], progress)

    def build_history(self, entries: Iterable[HistoryEntry], progress: bool = False) -> int:
        return self.chunks.build("history", [self.builder.history_chunk(e) for e in entries],
                                 progress)

    # ---- request path ---------------------------------------------------------------------
    def reuse_config(self, req: RankRequest, method: str | None, **overrides) -> ReuseConfig:
        """The request's reuse settings as named, validated: an alias ("exact-user") is kept
        here (it names the result) and resolved by `ReuseConfig.resolved` for the path."""
        merged = {**dict(req.overrides), **overrides}
        if method:
            merged["method"] = method
        known = {f.name for f in dataclasses.fields(ReuseConfig)}
        unknown = set(merged) - known
        if unknown:
            raise RcllmError(f"unknown override {sorted(unknown)[0]!r}")
        reuse = dataclasses.replace(self.cfg.reuse, **merged)
        reuse.validate()
        if reuse.method in METHOD_ALIASES and self.user_sides is None:
            raise RcllmError(f"method {reuse.method!r} needs the pointwise scorer (the "
                             "user-prefix cache); with the listwise prompt the exact peer is "
                             "'prefix'")
        return reuse

    def rank(self, req: RankRequest, method: str | None = None, keep_tensors: bool = False,
             explain: bool = False, **overrides) -> RankResult:
        """Ranks req.candidates; raises RcllmError for bad input."""
        t0, cpu0, wait0 = time.perf_counter(), time.thread_time(), thread_run_wait_ns()
        named = self.reuse_config(req, method, **overrides)
        reuse = named.resolved()
        prompt = self.strategy.prompt(req)                                      # prompt
        t1 = time.perf_counter()
        user = (self.user_sides.lookup(req, prompt, reuse)                      # look-ups
                if self.user_sides is not None else None)
        got = assemble(self.model, prompt, reuse, user, self.caches, self.strategy.head_rows)
        inp, stats = got.inp, got.stats
        t2 = time.perf_counter()
        res = prefill(self.model, inp, selection_policy(reuse), join=got.join)  # prefill
        t3 = time.perf_counter()
        with torch.inference_mode():                                            # scores
            scores_t, logits, hidden = self.strategy.score(self.model, prompt, inp,
                                                           res.hidden_out)
        if logits.is_cuda:  # the clock stops when the first token's logits exist, not sooner
            torch.cuda.synchronize(logits.device)
        cpu_ms = (time.thread_time() - cpu0) * 1e3   # read inside the TTFT's window: <= it
        wait1 = thread_run_wait_ns()
        ttft_ms = (time.perf_counter() - t0) * 1e3
        with torch.inference_mode():
            scores_t = self.strategy.after_first_token(self.model, prompt, inp, scores_t, logits)
        total_ms = (time.perf_counter() - t0) * 1e3
        scores = {c: float(s) for c, s in zip(prompt.candidates, scores_t)}
        t4 = time.perf_counter()
        self._after(reuse, prompt, got, user)                                  # stored after
        stats.after_ms = (time.perf_counter() - t4) * 1e3
        stats.add_prefill(res, inp.kind.cpu())
        stats.build_ms, stats.assemble_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        stats.prefill_ms, stats.thread_cpu_ms = ttft_ms - (t2 - t0) * 1e3, cpu_ms
        if wait0 is not None and wait1 is not None:
            stats.run_wait_ms = (wait1 - wait0) / 1e6
        result = RankResult(sorted(prompt.candidates, key=lambda c: -scores[c]), scores,
                            named.method, ttft_ms, total_ms, stats)
        if explain:
            result.explain = explain_request(
                self.loaded.tokenizer, self.model.arch.num_layers, prompt, inp, res, {
                    "build": stats.build_ms, "lookups_and_gather": stats.assemble_ms,
                    "layer0_and_selection": res.layer0_ms, "selective_layers": res.layers_ms,
                    "scoring": ttft_ms - (t3 - t0) * 1e3})
        if keep_tensors:
            result.logits = logits.detach()
            result.hidden = (hidden if hidden is not None
                             else self.model.final_hidden(res.hidden_last)).detach()
        return result

    def _after(self, reuse: ReuseConfig, prompt: Prompt, got: Assembly, user) -> None:
        """After the answer: exact prompts feed the prefix cache, misses the chunk store (built
        behind the answer on a store that can), a pointwise user side the user-prefix cache."""
        inp, shared = got.inp, len(prompt)
        if reuse.prefix_insert and reuse.method in ("full", "prefix"):
            upto = shared if prompt.blocks else shared - 1
            self.prefix.insert(prompt.token_ids, inp.k_buf, inp.v_buf, upto)
        jobs = got.stats.behind_tokens
        if reuse.cache_misses:
            jobs += self.chunks.build_behind(got.misses, reuse)
        else:
            for kind, _ in got.misses:
                self.store.count_miss(kind)
        if user is not None:
            jobs.append(self.user_sides.store(reuse, inp, user, self.store.run_behind))
        jobs[:] = [list(j) for j in jobs if j is not None]

    def prewarm(self, user_id: str, history: Sequence[HistoryEntry]) -> dict:
        """Pre-inference (RelayGR): the user's pointwise user side computed exactly and stored,
        so the user's next ranking hits. RcllmError when the engine has no user sides (a
        listwise scorer) or the history is too long."""
        if self.user_sides is None:
            raise RcllmError("prewarm needs the pointwise scorer (the user-prefix cache)")
        return self.user_sides.prewarm(user_id, history)
