"""LoRA fine-tuning of the embedded model as a ranker on the full and the fast path
(`rcllm finetune`, docs/finetune.md).

- `config`: the frozen option tree (model, prompt, lora, train).
- `paths`: candidate scores on the full path, the reuse (fast) path, or both in one pass.
- `trainer`: the joint objective, accumulation, validation, checkpoints, resume, the folder.
- `validate`: the evaluation's cases for validation users, NDCG@10 / CE per path.
- `choice`: the end-of-run fast-path choice the manifest's `fast_path` comes from (its trigger,
  the paths it tries, the rule) — `diagnose` holds the paths it scores.
- `learnt`: whether a run learnt anything (kept checkpoint not the start, validation CE below
  chance beyond noise); an adapter that did not names no fast path.
- `curves`: training and validation curves (JSON, PNG with the ln C line, text).
- `lora`: the low-rank factors, their effective weights during training and the merge at load.
- `adapter`: the saved adapter (safetensors + JSON manifest with checksum, prompt version and
  fast path), its fingerprint and the settings it is served with.
- `data`: training examples from the training users only, negatives, label-order shuffles.
- `optim`: a small AdamW whose state is plain tensors (checkpoints without pickle).

Layering: `rcllm.model.loading` imports `adapter` lazily when `model.adapter` is set.
"""
