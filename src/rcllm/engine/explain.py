"""`rank(explain=True)`: the request token by token, with the source of each slot's KV and what
the selection did, and the TTFT in parts. Reports only what the request path computed."""

from __future__ import annotations

from ..prefill.selective import PrefillInputs, PrefillResult
from ..prompt.builder import KINDS, Prompt
from .records import SOURCES


def explain(tokenizer, num_layers: int, prompt: Prompt, inp: PrefillInputs, res: PrefillResult,
            timing: dict) -> dict:
    """Token by token: text, segment kind, block (0 = shared, i = the i-th candidate's),
    the source of its KV, whether the selection recomputed it (layers 1..L-1; layer 0 runs
    on every non-exact token when the method probes) and the probe's deviation and
    attention mass; and the TTFT in parts (ms). Only what the request path computed."""
    tok = tokenizer
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
    last = num_layers - 1
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
