"""Layer-wise preloading (CachedAttention): hand out layer l while layers l+1.. load behind.

`LayerPrefetcher` runs `fetch_layer(0..L-1)` on a background thread into a bounded queue of
depth `lookahead`, and the consumer (the prefill's layer loop) iterates layers in order: layer
l's compute overlaps the fetch of layers l+1..l+lookahead. `chunk_layers()` applies this to a
request's chunks: the store lookups happen on the background thread too (so the caller can run
work such as the first, fully computed layer meanwhile), then each layer's K/V of every chunk
is copied to the target device in order.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, Iterator, Sequence, TypeVar

import torch

from .base import ChunkKey, ChunkKV, KVStore

T = TypeVar("T")
_DONE = object()


class LayerPrefetcher(Generic[T]):
    """Iterator of (layer, fetch_layer(layer)) for layer = 0..num_layers-1, in order.

    An exception in fetch_layer(l) is re-raised by the iteration that would yield layer l.
    close() (or leaving a `with` block) stops the background thread early."""

    def __init__(self, fetch_layer: Callable[[int], T], num_layers: int, lookahead: int = 2):
        if lookahead < 1:
            raise ValueError("lookahead must be >= 1")
        self.num_layers = num_layers
        self._fetch = fetch_layer
        self._queue: queue.Queue = queue.Queue(maxsize=lookahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-layer-prefetch", daemon=True)
        self._thread.start()

    def _offer(self, item: tuple) -> bool:
        """Puts item unless close() was called first; False when stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        for layer in range(self.num_layers):
            try:
                item = (layer, self._fetch(layer), None)
            except BaseException as exc:  # handed to the consumer
                item = (layer, None, exc)
            if not self._offer(item) or item[2] is not None:
                return
        self._offer((self.num_layers, _DONE, None))

    def __iter__(self) -> Iterator[tuple[int, T]]:
        while True:
            layer, value, error = self._queue.get()
            if error is not None:
                self.close()
                raise error
            if value is _DONE:
                return
            yield layer, value

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self) -> "LayerPrefetcher[T]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


LayerKV = list["tuple[torch.Tensor, torch.Tensor] | None"]


def chunk_layers(store: KVStore, keys: Sequence[ChunkKey], num_layers: int,
                 device: str | torch.device = "cpu", lookahead: int = 2
                 ) -> LayerPrefetcher[LayerKV]:
    """Per layer, the (k [H, T, D], v [H, T, D]) of each chunk on `device`, None for a chunk
    the store misses (the caller recomputes it). Lookups run once, before layer 0 is handed
    out, on the prefetch thread."""
    chunks: list[ChunkKV | None] = []

    def fetch(layer: int) -> LayerKV:
        if layer == 0:
            chunks.extend(store.get(k) for k in keys)
        return [None if c is None else (c.k[layer].to(device, non_blocking=True),
                                        c.v[layer].to(device, non_blocking=True))
                for c in chunks]

    return LayerPrefetcher(fetch, num_layers, lookahead)
