"""What the training prompt's chunks keep, per dataset and prompt style (issue 50, item 2).

For every history entry of every user: how many of the history chunk's tokens go to the
header (date and rating, or the rating word), to the item's name and to review text, and how
many chunks keep any review text under the recipe's cap (32 tokens). For every item: whether
its chunk (16 tokens) keeps the whole name and the brand. Tokenizer only, no model pass.

    .venv/bin/python scripts/prompt_budget.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from rcllm.config import ModelConfig
from rcllm.eval.datasets import load_dataset
from rcllm.finetune.config import default_prompt
from rcllm.model.loading import load_model
from rcllm.prompt.builder import PromptBuilder, item_brand, item_tag

STYLES = (("dated", "name"), ("compact", "lead"))


def count(ds, tok, style: str, ending: str) -> dict:
    import dataclasses

    cfg = dataclasses.replace(default_prompt(), history_style=style, item_ending=ending)
    b = PromptBuilder(tok, ds.items, cfg, 1 << 16)
    enc = b._encode
    review_tokens, with_review = [], 0
    entries = [e for hist in ds.users.values() for e in hist]
    for e in entries:
        ids = b.history_chunk(e)
        review = " ".join(e.review.split())
        r = enc(" " + review) if review else ()
        # the review is the chunk's end: count how many of its first tokens survive the cut
        kept = next((n for n in range(min(len(r), len(ids)), 0, -1)
                     if tuple(ids[-n:]) == tuple(r[:n])), 0)
        review_tokens.append(kept)
        with_review += kept > 0
    whole_name = brand = 0
    for item in ds.items.values():
        text = b._tok_text(b.item_chunk(item.item_id))
        whole_name += item_tag(item) in text
        br = item_brand(item)
        brand += br != item_tag(item) and br in text
    return {"entries": len(entries), "review_tokens_mean": float(np.mean(review_tokens)),
            "chunks_with_review": with_review / len(entries), "items": len(ds.items),
            "items_whole_name": whole_name / len(ds.items),
            "items_with_brand": brand / len(ds.items)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data")
    args = ap.parse_args()
    tok = load_model(ModelConfig(threads=1)).tokenizer
    PromptBuilder._tok_text = lambda self, ids: tok.decode(list(ids))
    sets = [("Magazine", "amazon2018", "amazon2018", "Magazine_Subscriptions"),
            ("Gift Cards", "amazon2018", "amazon2018", "Gift_Cards"),
            ("MovieLens 100K", "movielens-100k", "movielens", None)]
    print("| dataset | style (history / item) | review tokens per history chunk | history "
          "chunks with review text | items keeping the whole name | items keeping the brand |")
    print("|---|---|---|---|---|---|")
    for name, folder, fmt, cat in sets:
        path = os.path.join(args.data, folder)
        if not os.path.exists(path):
            continue
        ds = load_dataset(path, fmt, **({"category": cat} if cat else {}))
        for style, ending in STYLES:
            c = count(ds, tok, style, ending)
            print(f"| {name} | {style} / {ending} | {c['review_tokens_mean']:.1f} | "
                  f"{c['chunks_with_review']:.0%} | {c['items_whole_name']:.0%} | "
                  f"{c['items_with_brand']:.0%} |")


if __name__ == "__main__":
    main()
