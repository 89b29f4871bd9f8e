"""LoRA fine-tuning of the embedded model as a listwise ranker (`rcllm finetune`).

- `config`: the frozen option tree (model, prompt, lora, train).
- `lora`: the low-rank factors, their effective weights during training and the merge at load.
- `adapter`: the saved adapter (safetensors + JSON manifest with checksum) and its fingerprint.
- `data`: training examples from the training users only, negatives, label-order shuffles.
- `optim`: a small AdamW whose state is plain tensors (checkpoints without pickle).
- `trainer`: the loop, checkpoints, resume, and the cache folder an adapter is kept in.

Layering: `rcllm.model.loading` imports `adapter` lazily when `model.adapter` is set.
"""
