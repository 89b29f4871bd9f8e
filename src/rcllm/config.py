"""Configuration: frozen dataclasses, loaded from YAML with dotted overrides, validated here.

`load(RcllmConfig, "cfg.yaml", ["reuse.item_ratio=0.3"])` reads the YAML file (optional),
applies `--set section.field=value` overrides, converts values to the annotated field types and
validates. Any other frozen-dataclass tree (the simulator's, say) can use `load` too.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Sequence

import yaml

from .errors import RcllmError

METHODS = ("full", "prefix", "naive", "cacheblend", "epic", "rcllm", "late", "exact-user")
# A method that is another method's settings under its own name. "exact-user" is the strongest
# exact peer of a fast path for a returning or prewarmed user (vLLM's prefix caching of a grown
# history, RelayGR, MTServe): the user side from the user-prefix cache, served only where it
# was built exactly (else computed in the request), and every candidate token computed: late
# at layer 0. It loses nothing (tests/userprefix/test_exact_user.py pins it to full).
METHOD_ALIASES = {"exact-user": {"method": "late", "late_layer": 0, "user_prefix": True,
                                 "user_side": "exact"}}
# Bumped whenever the text of a chunk or template the prompt builders make changes: an adapter
# records the version it was trained on and is refused under another
# (model.adapter_file.check_prompt_version). 2: item chunks end in the item's tag.
PROMPT_VERSION = 2
# the pointwise block's fixed ending after the item chunk (`prompt.block_ending`)
BLOCK_ENDINGS = {"answer": "? Answer:", "mark": "?"}
REUSE_METHODS = ("naive", "cacheblend", "epic", "rcllm", "late")  # methods that reuse chunk KV
# the methods that read the user side from the user-prefix cache (pointwise scorer): the reuse
# methods, exact-user, and an adapter's fast path; full and prefix compute it in every request
USER_SIDE_METHODS = (*REUSE_METHODS, *METHOD_ALIASES, "adapter")
# the methods whose exact prompts an engine inserts into its prefix cache (Engine._after)
PREFIX_INSERTING = ("full", "prefix")
USER_SIDES = ("reuse", "exact", "behind")  # reuse.user_side


def opt(default: Any, help_text: str) -> Any:
    """A dataclass field with its help text (shown by `--help` through `describe`)."""
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class ModelConfig:
    path: str = opt("", "GGUF file or HF safetensors folder; \"\" = the bundled SmolLM2-135M")
    dtype: str = opt("float32", "float32 | bfloat16 | float16")
    device: str = opt("cpu", "cpu | cuda | cuda:N")
    threads: int = opt(2, "torch intra-op threads on CPU (0 = leave torch's default)")
    cache_dir: str = opt("", "where converted weights live; \"\" = $RCLLM_CACHE or ~/.cache/rcllm")
    adapter: str = opt("", "LoRA adapter from `rcllm finetune` (folder or adapter.json), merged "
                           "into the weights at load; part of the fingerprint")

    def validate(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise RcllmError(f"model.dtype must be float32, bfloat16 or float16, not {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise RcllmError(f"model.device must be cpu or cuda[:N], not {self.device!r}")
        if self.threads < 0:
            raise RcllmError("model.threads must be >= 0")


@dataclass(frozen=True)
class ReuseConfig:
    method: str = opt("rcllm", "full | prefix | naive | cacheblend | epic | rcllm | late | exact-user (pointwise scorer: the user side reused exactly, every candidate token computed; lossless)")
    item_ratio: float = opt(0.3, "fraction of reused item tokens recomputed (cacheblend uses it too)")
    history_ratio: float = opt(0.3, "fraction of reused history tokens recomputed")
    window: int = opt(16, "rcllm: first tokens of each chunk recomputed first (in budget)")
    epic_k: int = opt(2, "epic: first k tokens of each chunk recomputed (EPIC's k = 32 on 512-token chunks is ~6 percent; 2 on this engine's 16-32-token chunks keeps that proportion)")
    attention_weight: float = opt(1.0, "rcllm: weight of the attention mass vs deviation")
    attention_layer: int = opt(0, "rcllm: heavy hitters from layer 0 or layer 1 attention")
    rcllm_select: str = opt("blend", "rcllm: how reused tokens are ranked for the budget (after each chunk's window). \"blend\": layer-1 KV deviation + attention_weight x the attention mass the answer queries give them; \"attention\": the attention mass alone (the question decides, not the deviation: ProphetKV's point); \"overlap\": no probe at all, the item tokens inside a run of >= 3 tokens that also occurs in the user's history chunks first (the same magazine, the same publisher), then each chunk's first tokens")
    overlap_fill: str = opt("order", "rcllm_select=overlap: where the budget left after the shared runs goes. \"order\": each chunk's window, earliest slot first (whole chunks of the first candidates); \"ends\": every chunk alike, its last reused tokens first (the item's name, nearest the answer), round-robin over the chunks")
    depth_decay: float = opt(0.35, "rcllm: budgets shrink with depth: layer l recomputes ratio^(1 + depth_decay * t) of a kind's reused tokens, t = 0 at layer 1 and 1 at the last layer, the probe's lowest-scored dropped first (0 = the same budget in every layer; a 1.0 ratio stays 1.0; measured: docs/engine.md)")
    chunk_context: str = opt("template", "chunks built after: \"template\" | \"instruction\" | \"none\"")
    prefix_block: int = opt(16, "prefix cache granularity in tokens (vLLM-style blocks)")
    cache_misses: bool = opt(True, "store the KV of chunk misses after answering")
    prefix_insert: bool = opt(True, "exact prompts (full, prefix) feed the prefix cache; benchmarks turn it off so a request never hits its own earlier run")
    store_bytes: int = opt(4 << 30, "byte budget of the in-memory chunk store")
    behind_nice: int = opt(10, "niceness (0-19) of the thread that builds chunk misses behind the answers: above 0 a build yields the core to the request path (served sweep at 1.3x capacity: reuse requests' engine threads waited for a core 22-29 percent of their time at nice 0, 11-13 percent at 10); 0 = the engine's priority")
    prototypes: bool = opt(True, "fill review chunks missing from the exact cache from the history prototype library (when history.library is set)")
    overlap: bool = opt(False, "gather and rotate layer l+1's reused KV in a thread while layer l computes (measured: docs/engine.md)")
    budget_scope: str = opt("prompt", "rcllm: what a kind's recompute budget is spread over: \"prompt\" (the best-scored reused tokens of the whole prompt) or \"block\" (each pointwise candidate block recomputes the same share of its own item tokens, so no candidate's score is recomputed more than another's)")
    item_tail: int = opt(0, "reuse methods: the last k tokens of every reused item chunk are computed in the prompt (they see the user side), not taken from the store; an adapter trained with train.reuse_tail=k sets it")
    late_layer: int = opt(20, "late (pointwise scorer): the item chunks' KV comes from the store in the layers below this one; from it up every item token is computed against the user side and its own block, starting from its state entering the layer in the chunk's own pass (carried on the item's store entry through every tier when it was built for late). 0 = every item token computed (full's item side); num_layers = naive reuse of the whole chunk")
    user_prefix: bool = opt(True, "pointwise scorer, reuse methods: take the user side from the user-prefix cache when this history was seen, and store it there after answering")
    user_side: str = opt("reuse", "pointwise scorer, reuse methods: how the user side is built on a user-prefix miss and what the cache may serve. \"reuse\": from reused history chunks as the method says, stored as served; \"exact\": its history chunks are not reused (the miss computes the user side in the request), stored exact; \"behind\": the miss is served as with \"reuse\" and the exact user side is computed after the answer and stored. \"exact\" and \"behind\" serve only entries built exactly. A reuse-aware adapter (trained with the user side exact) sets \"behind\"")

    def validate(self) -> None:
        if self.method not in METHODS:
            raise RcllmError(f"reuse.method must be one of {', '.join(METHODS)}, not {self.method!r}")
        for name in ("item_ratio", "history_ratio"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise RcllmError(f"reuse.{name} must be within [0, 1], got {v}")
        if self.chunk_context not in ("template", "instruction", "none"):
            raise RcllmError("reuse.chunk_context must be 'template', 'instruction' or 'none'")
        if self.prefix_block < 1 or self.store_bytes < 1:
            raise RcllmError("reuse.prefix_block and reuse.store_bytes must be positive")
        if not 0 <= self.behind_nice <= 19:
            raise RcllmError(f"reuse.behind_nice must be within [0, 19], got {self.behind_nice}")
        if self.attention_layer not in (0, 1):
            raise RcllmError("reuse.attention_layer must be 0 or 1")
        if self.depth_decay < 0:
            raise RcllmError("reuse.depth_decay must be >= 0")
        if self.window < 0 or self.epic_k < 0 or self.item_tail < 0 or self.late_layer < 0:
            raise RcllmError("reuse.window, reuse.epic_k, reuse.item_tail and "
                             "reuse.late_layer must be >= 0")
        if self.rcllm_select not in ("blend", "attention", "overlap"):
            raise RcllmError(f"reuse.rcllm_select must be blend, attention or overlap, not "
                             f"{self.rcllm_select!r}")
        if self.overlap_fill not in ("order", "ends"):
            raise RcllmError(f"reuse.overlap_fill must be 'order' or 'ends', "
                             f"not {self.overlap_fill!r}")
        if self.budget_scope not in ("prompt", "block"):
            raise RcllmError(f"reuse.budget_scope must be 'prompt' or 'block', "
                             f"not {self.budget_scope!r}")
        if self.user_side not in USER_SIDES:
            raise RcllmError(f"reuse.user_side must be one of {', '.join(USER_SIDES)}, "
                             f"not {self.user_side!r}")

    def resolved(self) -> "ReuseConfig":
        """These settings with an aliased method (METHOD_ALIASES) replaced by what it names;
        the alias's settings win over any given beside it, so "exact-user" stays exact."""
        alias = METHOD_ALIASES.get(self.method)
        return dataclasses.replace(self, **alias) if alias else self


@dataclass(frozen=True)
class PromptConfig:
    max_candidates: int = opt(20, "most candidates per request (labels A..Z, at most 26)")
    history_window: int = opt(10, "most recent reviews used")
    max_review_tokens: int = opt(96, "a review longer than this is cut (documented truncation)")
    max_item_tokens: int = opt(96, "item text longer than this is cut")
    item_ending: str = opt("name", "how an item chunk spends its tokens: \"lead\" = the "
                                   "item's name first (at most 9 tokens), then its brand "
                                   "(a \"Brand — text\" title's lead: Magazine's publisher; "
                                   "at most 5), then the description not already in the name; "
                                   "\"name\" = the title and description, ending in \" | <item "
                                   "name>\" (what an item tail recomputes); \"brand\" = ending "
                                   "in \" | <brand>\"; \"text\" = the title and description "
                                   "cut at max_item_tokens (prompt version 1's chunk)")
    history_style: str = opt("dated", "how a history chunk spends its tokens: \"compact\" "
                                        "= a one-token rating word, the item's name (at most 8 "
                                        "tokens), then the review text; \"dated\" = "
                                        "\"[YYYY-MM-DD, r/5] <title>: <review>\" (~17 tokens "
                                        "of date and rating). dated and name stay the "
                                        "defaults: compact/lead trained worse on Magazine "
                                        "(docs/finetune.md)")
    block_ending: str = opt("answer", "what a pointwise block ends in after the item chunk, "
                                      "computed for every candidate (the Yes/No is read at its "
                                      "last token): \"answer\" = \"? Answer:\" (3 tokens); "
                                      "\"mark\" = \"?\" (1 token: fewer tokens computed per "
                                      "candidate)")

    def validate(self) -> None:
        if not 1 <= self.max_candidates <= 26:
            raise RcllmError("prompt.max_candidates must be within 1..26 (labels A..Z)")
        if self.item_ending not in ("lead", "name", "brand", "text"):
            raise RcllmError(f"prompt.item_ending must be lead, name, brand or text, not "
                             f"{self.item_ending!r}")
        if self.history_style not in ("compact", "dated"):
            raise RcllmError(f"prompt.history_style must be compact or dated, not "
                             f"{self.history_style!r}")
        if self.block_ending not in BLOCK_ENDINGS:
            raise RcllmError(f"prompt.block_ending must be {' or '.join(BLOCK_ENDINGS)}, not "
                             f"{self.block_ending!r}")
        if self.history_window < 0:
            raise RcllmError("prompt.history_window must be >= 0")


@dataclass(frozen=True)
class HistoryConfig:
    library: str = opt("", "history prototype library (from `rcllm build-history`); \"\" = exact chunk cache only")
    threshold: float = opt(0.9, "a new review token reuses its nearest prototype's KV at cosine >= this")
    search: str = opt("lsh", "\"lsh\": the prototype of the token's LSH bucket (fast); \"exact\": nearest of all by cosine")

    def validate(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise RcllmError("history.threshold must be within [-1, 1]")
        if self.search not in ("lsh", "exact"):
            raise RcllmError(f"history.search must be 'lsh' or 'exact', not {self.search!r}")


@dataclass(frozen=True)
class UserPrefixConfig:
    max_bytes: int = opt(1 << 30, "byte budget of the user-prefix cache (pointwise scorer)")
    ttl_s: float = opt(0.0, "entry TTL in seconds; 0 = adaptive (3 x the user's mean request gap, at most max_ttl_s)")
    max_ttl_s: float = opt(300.0, "upper bound of the adaptive TTL")
    int8: bool = opt(False, "store user sides as INT8 K/V with per-channel scales")
    spill_bytes: int = opt(0, "host spill tier for evicted user sides (0 = off)")
    refresh_every: int = opt(50, "a user side is extended by appends at most this many times in a row, then computed anew (bounds INT8 error)")

    def validate(self) -> None:
        if self.max_bytes <= 0 or self.spill_bytes < 0:
            raise RcllmError("userprefix.max_bytes must be > 0 and userprefix.spill_bytes >= 0")
        if self.ttl_s < 0 or self.max_ttl_s <= 0:
            raise RcllmError("userprefix.ttl_s must be >= 0 and userprefix.max_ttl_s > 0")
        if self.refresh_every < 1:
            raise RcllmError("userprefix.refresh_every must be >= 1")


@dataclass(frozen=True)
class RcllmConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    reuse: ReuseConfig = field(default_factory=ReuseConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    userprefix: UserPrefixConfig = field(default_factory=UserPrefixConfig)

    def validate(self) -> None:
        self.model.validate()
        self.reuse.validate()
        self.prompt.validate()
        self.history.validate()
        self.userprefix.validate()


def _convert(value: Any, tp: Any, where: str) -> Any:
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise RcllmError(f"{where} must be a mapping")
        return _build(tp, value, where)
    try:
        if tp is bool and isinstance(value, str):
            low = value.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return low in ("true", "1", "yes")
        if tp in (int, float, str, bool):
            return tp(value)
    except (TypeError, ValueError):
        raise RcllmError(f"{where} expects {tp.__name__}, got {value!r}") from None
    return value


def _build(cls: type, data: dict, where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise RcllmError(f"unknown option {where + '.' if where else ''}{sorted(unknown)[0]}; "
                         f"known: {', '.join(sorted(names))}")
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def _as_dict(obj: Any) -> dict:
    return {f.name: (_as_dict(getattr(obj, f.name))
                     if dataclasses.is_dataclass(getattr(obj, f.name)) else getattr(obj, f.name))
            for f in dataclasses.fields(obj)}


def _set_dotted(tree: dict, dotted: str, raw: str) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            raise RcllmError(f"unknown option section {p!r} in --set {dotted}")
        node = node[p]
    if parts[-1] not in node:
        raise RcllmError(f"unknown option {dotted!r}")
    node[parts[-1]] = yaml.safe_load(raw) if raw != "" else ""


def load(cls: type, path: str | None = None, overrides: Sequence[str] = ()) -> Any:
    """Builds `cls` from defaults, then the YAML file at `path`, then `key=value` overrides."""
    tree = _as_dict(cls())
    if path:
        for key, value in file_options(path):
            _set_dotted(tree, key, yaml.safe_dump(value))
    for item in overrides:
        if "=" not in item:
            raise RcllmError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), raw.strip())
    cfg = _build(cls, tree)
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def file_options(path: str) -> list[tuple[str, Any]]:
    """The (dotted key, value) pairs a YAML options file sets."""
    if not os.path.exists(path):
        raise RcllmError(f"config file not found: {path}")
    with open(path, encoding="utf-8") as fh:
        loaded = yaml.safe_load(fh) or {}
    if not isinstance(loaded, dict):
        raise RcllmError(f"config file {path} must hold a mapping at top level")
    return list(_flatten(loaded))


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per option with its default, for `--help`."""
    lines = []
    inst = cls()
    for f in dataclasses.fields(cls):
        v = getattr(inst, f.name)
        if dataclasses.is_dataclass(v):
            lines += describe(type(v), f"{prefix}{f.name}.")
        else:
            help_text = f.metadata.get("help", "")
            lines.append(f"  {prefix}{f.name} = {v!r}" + (f"  ({help_text})" if help_text else ""))
    return lines
