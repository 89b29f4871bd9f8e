"""`rcllm eval --html DIR`: a static report — eval's table, the TTFT CDF and budget heat map,
and a few example requests rendered like the /ui page (every token coloured by where its KV
came from, recomputed tokens hatched, the ranking beside full's). One self-contained
`report.html` (plots embedded, the page's stylesheet inlined): no server, no network.
"""

from __future__ import annotations

import base64
import html
import os

from ..report import compare, stylesheet

SOURCE_TEXT = {"fresh": "computed fresh", "prefix": "prefix cache",
               "user_prefix": "user-prefix cache", "chunk": "chunk store",
               "prototype": "history prototype"}


def _fmt(x) -> str:
    if x is None or x == "-":
        return "–"
    return f"{x:.3f}" if isinstance(x, float) else html.escape(str(x))


def _table(rows: list[dict], columns) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _prompt(ex: dict) -> str:
    out, block = [], None
    for t in ex["tokens"]:
        if t["block"] != block:
            if block is not None:
                out.append("</span>")
            block = t["block"]
            label = ("shared part / user side" if block == 0
                     else f"candidate {block}: {ex['candidates'][block - 1]}")
            out.append(f'<span class="blk"><span class="blk-label">{html.escape(label)}\n</span>')
        tip = (f"{SOURCE_TEXT[t['source']]}{', recomputed' if t['recomputed'] else ''}; "
               f"deviation {_fmt(t['deviation'])}, attention {_fmt(t['attention'])}")
        cls = f"t s-{t['source']}" + (" rc" if t["recomputed"] else "")
        out.append(f'<span class="{cls}" title="{html.escape(tip)}">'
                   f"{html.escape(t['text'])}</span>")
    return '<div class="prompt">' + "".join(out) + "</span></div>"


def _example(case, method_res, full_res) -> str:
    ex = method_res.explain
    cmp = compare(method_res.ranking, method_res.scores, full_res.ranking, full_res.scores,
                  list(ex["candidates"]))
    counts: dict[str, int] = {}
    for t in ex["tokens"]:
        counts[t["source"]] = counts.get(t["source"], 0) + 1
    recomputed = sum(t["recomputed"] for t in ex["tokens"])
    legend = "".join(f'<li><span class="sw t s-{s}"></span>{SOURCE_TEXT[s]} {counts[s]}</li>'
                     for s in ex["sources"] if counts.get(s))
    legend += f'<li><span class="sw rc"></span>recomputed by the selection {recomputed}</li>'
    total = sum(ex["timing_ms"].values()) or 1.0
    bar = "".join(f'<div class="p{i}" style="width:{100 * v / total:.1f}%" '
                  f'title="{html.escape(k)} {v:.1f} ms"></div>'
                  for i, (k, v) in enumerate(ex["timing_ms"].items()))
    parts = ", ".join(f"{k} {v:.1f} ms" for k, v in ex["timing_ms"].items())
    rows = [{"rank": r["rank"], "item": r["item_id"] + (" (target)" if r["item_id"] == case.target
                                                         else ""),
             "score": r["score"], "full rank": r["full_rank"], "change": r["rank_change"]}
            for r in cmp["rows"]]
    return (f"<h3>user {html.escape(str(case.user_id))} — {html.escape(method_res.method)}, "
            f"TTFT {method_res.ttft_ms:.0f} ms (full {full_res.ttft_ms:.0f} ms)</h3>"
            f'<ul class="legend">{legend}</ul>'
            f'<div class="bar" role="img" aria-label="{html.escape(parts)}">{bar}</div>'
            f'<p class="hint">{html.escape(parts)}</p>'
            f'<div class="cols">{_prompt(ex)}<div><p class="agreement">KL(full ‖ method) '
            f'{cmp["kl"]:.4f} · top-1 {"agrees" if cmp["top1_agree"] else "differs"}</p>'
            f'{_table(rows, ["rank", "item", "score", "full rank", "change"])}</div></div>')


def write_html(folder: str, title: str, rows: list[dict], columns, engine, cases, variants,
               plots: str | None, examples: int = 2) -> str:
    """Writes `folder/report.html`; ranks `examples` cases again with explain (the first
    reuse variant, and full) to render them. Returns the file's path."""
    from ..prompt.builder import RankRequest

    os.makedirs(folder, exist_ok=True)
    css = stylesheet()
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{html.escape(title)}</title><style>{css}</style></head><body>"
             f"<header><h1>{html.escape(title)}</h1></header><main>",
             "<h2>Quality, fidelity and TTFT per method</h2>", _table(rows, columns)]
    for name in ("ttft_cdf.png", "heatmap.png"):
        path = os.path.join(plots or "", name)
        if plots and os.path.exists(path):
            data = base64.b64encode(open(path, "rb").read()).decode()
            parts.append(f'<h2>{name[:-4].replace("_", " ")}</h2>'
                         f'<img alt="{name}" src="data:image/png;base64,{data}">')
    shown = next((v for v in variants if v.method != "full"), None)
    if shown is not None:
        parts.append("<h2>Example requests (hover a token for its deviation and attention)</h2>")
        for case in cases[:examples]:
            req = RankRequest(case.user_id, case.history, case.candidates)
            res = engine.rank(req, shown.method, explain=True, prefix_insert=False,
                              cache_misses=False, **shown.overrides())
            full = engine.rank(req, "full", prefix_insert=False, cache_misses=False)
            parts.append(_example(case, res, full))
    parts.append("</main></body></html>")
    out = os.path.join(folder, "report.html")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write("".join(parts))
    return out
