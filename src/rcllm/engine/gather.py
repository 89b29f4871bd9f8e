"""The layer gather: reused KV copied into the prompt's buffers layer by layer, off the
prefill's thread (`reuse.overlap`)."""

from __future__ import annotations

import threading

import torch

from ..kvstore.base import KVMatch


class LayerGather:
    """Copies reused chunk KV into the prompt's buffers layer by layer in a thread, and rotates
    each layer's keys to their prompt positions, while the prefill computes earlier layers
    (`reuse.overlap`). Calling it with a layer blocks until that layer is ready and returns its
    rotated keys [H_kv, N, D]; a failure in the thread is raised there, never swallowed."""

    def __init__(self, model, k_buf: torch.Tensor, v_buf: torch.Tensor,
                 matches: list[KVMatch], positions: torch.Tensor):
        copies = [c for m in matches for c in m.copies()]
        self._ready = [threading.Event() for _ in range(k_buf.shape[0])]
        self._rotated: list[torch.Tensor | None] = [None] * k_buf.shape[0]
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run,
                                        args=(model, k_buf, v_buf, copies, positions),
                                        name="rcllm-kv-gather", daemon=True)
        self._thread.start()

    def _run(self, model, k_buf, v_buf, copies, positions) -> None:
        try:
            with torch.inference_mode():
                for layer, ready in enumerate(self._ready):
                    for s, e, k, v in copies:
                        k_buf[layer, :, s:e] = k[layer]
                        v_buf[layer, :, s:e] = v[layer]
                    if layer:  # the prefill rotates layer 0 itself
                        self._rotated[layer] = model.rope(k_buf[layer], positions)
                    ready.set()
        except BaseException as exc:  # surfaced to the prefill by __call__
            self._error = exc
            for ready in self._ready:
                ready.set()

    def __call__(self, layer: int) -> torch.Tensor:
        self._ready[layer].wait()
        if self._error is not None:
            raise RuntimeError("gathering reused KV failed") from self._error
        return self._rotated[layer]
