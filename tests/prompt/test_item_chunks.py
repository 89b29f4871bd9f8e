"""Item chunks: what they end in (`prompt.item_ending`); the pointwise block's ending
(`prompt.block_ending`); and that an adapter's endings are adopted."""

from __future__ import annotations

import json

import pytest

from rcllm.config import PromptConfig, RcllmConfig
from rcllm.errors import RcllmError
from rcllm.prompt.builder import PromptBuilder, item_brand, item_tag, item_text
from rcllm.records import Item

ITEMS = {"m1": Item("m1", "Condé Nast — The New Yorker", "Weekly magazine of reporting, "
                    "commentary, criticism, fiction, satire, cartoons and poetry."),
         "f1": Item("f1", "Heat (1995)", "")}


def _builder(real_model, **prompt) -> PromptBuilder:
    return PromptBuilder(real_model.tokenizer, ITEMS, PromptConfig(**prompt), 4096)


def test_item_tag_drops_publisher_and_year():
    assert item_tag(ITEMS["m1"]) == "The New Yorker"
    assert item_tag(ITEMS["f1"]) == "Heat"


def test_lead_chunk_starts_with_name_then_brand(real_model):
    """`item_ending=lead` spends the first tokens on what identifies the item: the name, the
    brand (when the title has one), then the description."""
    b = _builder(real_model, max_item_tokens=24, item_ending="lead")
    enc = b._encode
    ids = b.item_chunk("m1")
    head = enc(" The New Yorker") + enc(" (Condé Nast") + enc(")")
    assert ids[:len(head)] == head and len(ids) <= 24
    assert ids[len(head):] == enc(". " + ITEMS["m1"].description)[: 24 - len(head)]
    assert b.item_chunk("f1") == enc(" Heat")      # no brand, no description
    assert len(_builder(real_model, max_item_tokens=6, item_ending="lead").item_chunk("m1")) == 6


def test_compact_history_chunk_spends_tokens_on_the_review(real_model):
    """`history_style=compact`: one rating token, the name, the review; no date."""
    from rcllm.records import HistoryEntry

    b = _builder(real_model, max_review_tokens=16, history_style="compact")
    e = HistoryEntry("m1", 4.0, "Sharp writing every single week, worth it.", 1_400_000_000)
    ids = b.history_chunk(e)
    enc = b._encode
    head = enc(" liked") + enc(" The New Yorker") + enc(":")
    assert len(enc(" liked")) == 1 and ids[:len(head)] == head
    assert ids[len(head):] == enc(" " + e.review)[: 16 - len(head)]
    dated = _builder(real_model, max_review_tokens=16, history_style="dated").history_chunk(e)
    assert "2014" in real_model.tokenizer.decode(list(dated))
    with pytest.raises(RcllmError, match="history_style"):
        PromptConfig(history_style="long").validate()


def test_name_ending_ends_in_the_item_name(real_model):
    b = _builder(real_model, max_item_tokens=16, item_ending="name")
    enc = b._encode
    ids = b.item_chunk("m1")
    tag = enc(" | The New Yorker")
    assert len(ids) <= 16 and ids[-len(tag):] == tag
    assert ids[: -len(tag)] == enc(" " + item_text(ITEMS["m1"]))[: 16 - len(tag)]


def test_text_ending_is_the_text_cut_at_the_limit(real_model):
    b = _builder(real_model, max_item_tokens=16, item_ending="text")
    ids = b.item_chunk("m1")
    assert ids == b._encode(" " + item_text(ITEMS["m1"]))[:16]
    assert b._encode(" | The New Yorker")[-1] not in ids[-3:]   # no name at the end
    assert b.item_chunk("f1") == b._encode(" Heat (1995)")       # short text: whole


def test_brand_ending_ends_in_the_brand(real_model):
    assert item_brand(ITEMS["m1"]) == "Condé Nast" and item_brand(ITEMS["f1"]) == "Heat"
    b = _builder(real_model, max_item_tokens=16, item_ending="brand")
    tag = b._encode(" | Condé Nast")
    ids = b.item_chunk("m1")
    assert len(ids) <= 16 and ids[-len(tag):] == tag
    assert b.item_chunk("f1")[-len(b._encode(" | Heat")):] == b._encode(" | Heat")  # no brand


def test_bad_ending_is_refused():
    with pytest.raises(RcllmError, match="item_ending"):
        PromptConfig(item_ending="title").validate()


def test_mark_block_ending_is_one_token_after_the_item(real_model):
    """`prompt.block_ending=mark` ends each candidate block in "?" alone (one computed token
    per candidate instead of the 3 of "? Answer:"); the item chunk and head are unchanged."""
    from rcllm.prompt.pointwise import PointwisePrompt

    blocks = {}
    for ending in ("answer", "mark"):
        pw = PointwisePrompt(_builder(real_model, max_item_tokens=16, block_ending=ending), 4096)
        blocks[ending] = pw.candidate_ids("m1")
        assert blocks[ending][:len(pw.head_ids) + 16] == (pw.head_ids
                                                           + pw.builder.item_chunk("m1"))
    assert len(blocks["answer"]) - len(blocks["mark"]) == 2
    assert blocks["mark"][-1] == real_model.tokenizer("?", add_special_tokens=False)["input_ids"][0]
    with pytest.raises(RcllmError, match="block_ending"):
        PromptConfig(block_ending="none").validate()


def test_adapter_ending_is_adopted(tmp_path):
    """An adapter trained with item_ending=text is evaluated and served on its own chunks;
    manifests from before the field mean the name ending."""
    from rcllm.finetune.adapter import eval_settings
    from rcllm.config import PROMPT_VERSION
    from rcllm.model.adapter_file import FORMAT

    def manifest(prompt: dict) -> str:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "adapter.json").write_text(json.dumps({
            "format": FORMAT, "prompt_version": PROMPT_VERSION, "prompt": prompt,
            "split": {"fractions": [0.8, 0.1, 0.1], "seed": 0}, "train": {}}))
        return str(folder)

    base = dict(max_candidates=20, history_window=5, max_review_tokens=32, max_item_tokens=16)
    cfg, _, _ = eval_settings(RcllmConfig(), manifest({**base, "item_ending": "text"}))
    assert cfg.prompt.item_ending == "text"
    cfg, _, _ = eval_settings(RcllmConfig(), manifest({**base, "block_ending": "mark"}))
    assert cfg.prompt.block_ending == "mark"
    cfg, _, _ = eval_settings(RcllmConfig(), manifest(base))
    assert (cfg.prompt.item_ending, cfg.prompt.block_ending) == ("name", "answer")


def test_manifest_without_ending_means_name_whatever_the_default(tmp_path, monkeypatch):
    """Adapters from before `prompt.item_ending` were trained on the name ending: read so even
    if the default changes."""
    import dataclasses

    import rcllm.config
    from rcllm.config import PROMPT_VERSION
    from rcllm.finetune.adapter import eval_settings
    from rcllm.model.adapter_file import FORMAT

    @dataclasses.dataclass(frozen=True)
    class BrandDefault(PromptConfig):
        item_ending: str = "brand"

    monkeypatch.setattr(rcllm.config, "PromptConfig", BrandDefault)
    (tmp_path / "adapter.json").write_text(json.dumps({
        "format": FORMAT, "prompt_version": PROMPT_VERSION, "train": {},
        "prompt": dict(max_candidates=20, history_window=5, max_review_tokens=32,
                       max_item_tokens=16),
        "split": {"fractions": [0.8, 0.1, 0.1], "seed": 0}}))
    cfg, _, _ = eval_settings(RcllmConfig(prompt=BrandDefault()), str(tmp_path))
    assert cfg.prompt.item_ending == "name"
