"""Saves the tiny random-weight llama of the tests (3 layers, hidden 64, the bundled model's
tokenizer) as a model folder, for `--set model.path=DIR` in the serving benchmarks:

    python scripts/make_tiny_model.py /tmp/rcllm-tiny
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(out: str) -> None:
    from safetensors.torch import save_file

    from rcllm.config import ModelConfig
    from rcllm.model.loading import load_model
    from tiny_models import tiny_hf_model

    real = load_model(ModelConfig())
    hf, cfg = tiny_hf_model("llama")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    for f in real.folder.glob("*"):
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            shutil.copy(f, folder / f.name)
    print(folder)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rcllm-tiny")
