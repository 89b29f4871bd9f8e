"""The chunk store's item KV is built in the prompt's own neighbourhood: after the same
instruction (the same first token, the attention sink; no BOS on either side) and the same
block head, with the chunk's own first token (its leading space) as in the prompt. Item KV
from the store then differs from the prompt's only by what the user side adds."""

from __future__ import annotations

import torch

from rcllm.config import ModelConfig, RcllmConfig, ReuseConfig
from rcllm.engine import Engine
from rcllm.eval.datasets import load_dataset
from rcllm.model.loading import load_model
from rcllm.prompt.builder import RankRequest


def test_item_kv_is_built_behind_the_prompts_instruction_and_block_head(tiny_model_dir):
    ds = load_dataset("", "synthetic", num_users=4, num_items=12, seed=0)
    loaded = load_model(ModelConfig(path=str(tiny_model_dir), threads=0))
    eng = Engine(loaded, ds.items, RcllmConfig(reuse=ReuseConfig(prefix_insert=False)),
                 scorer="pointwise")
    assert eng.cfg.reuse.chunk_context == "template"  # the default
    pw, tok = eng.pointwise, loaded.tokenizer
    user = sorted(ds.users)[0]
    cands = tuple(sorted(ds.items)[:3])
    prompt = pw.prompt(RankRequest(user, tuple(ds.users[user][:2]), cands))
    ctx = eng.chunks._context_ids("item")
    # the build context is the prompt's instruction followed by the block head, token for
    # token: the prompt's shared part starts and ends with the same tokens
    assert list(ctx) == list(pw.instruction_ids) + list(pw.head_ids)
    ids = list(prompt.token_ids)
    assert ids[:len(pw.instruction_ids)] == list(pw.instruction_ids)
    assert ids[-len(pw.head_ids):] == list(pw.head_ids)
    # the same first token on both sides (SmolLM2's "<|im_start|>", which is also its BOS):
    # the attention sink the chunk sees is the prompt's; no BOS is added inside a chunk
    assert ids[0] == ctx[0] and ids.count(ids[0]) == list(ctx).count(ctx[0])
    for (item, _), c in zip(prompt.blocks, cands):
        chunk = eng.builder.item_chunk(c)
        assert tuple(item.token_ids) == tuple(chunk) and tok.bos_token_id not in chunk
        # the chunk keeps its leading space: its first token is the one the prompt's text
        # " <title>" tokenises to, not a space-less variant
        assert tok.decode([chunk[0]]).startswith(" ")
        # the stored KV is the chunk's KV in one forward over context + chunk
        kv = eng.chunks.compute("item", chunk)
        t = torch.tensor(list(ctx) + list(chunk))
        ref = loaded.model.forward(t, return_kv=True, logits=False)
        n = len(chunk)
        torch.testing.assert_close(kv.k, ref["k"][:, :, -n:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(kv.v, ref["v"][:, :, -n:], rtol=1e-4, atol=1e-4)
