import threading

import pytest
from kv_helpers import make_entry

from rcllm.kvstore.base import MemoryLRUStore
from rcllm.kvstore.preload import LayerPrefetcher, chunk_layers


def test_layers_come_in_order_and_fetch_runs_ahead():
    fetched = []

    def fetch(layer):
        fetched.append(layer)
        return layer * 10

    pf = LayerPrefetcher(fetch, num_layers=6, lookahead=2)
    seen = []
    for layer, value in pf:
        if layer == 0:
            # while layer 0 is being "computed", the prefetcher has loaded the next ones
            while len(fetched) < 3:
                threading.Event().wait(0.001)
        seen.append((layer, value))
    assert seen == [(i, i * 10) for i in range(6)] and fetched == list(range(6))


def test_fetch_error_surfaces_at_its_layer():
    def fetch(layer):
        if layer == 2:
            raise OSError("disk gone")
        return layer

    got = []
    with pytest.raises(OSError):
        for layer, _ in LayerPrefetcher(fetch, num_layers=5):
            got.append(layer)
    assert got == [0, 1]


def test_close_stops_early():
    pf = LayerPrefetcher(lambda layer: layer, num_layers=1000, lookahead=1)
    for layer, _ in pf:
        if layer == 3:
            break
    pf.close()
    assert not pf._thread.is_alive()


def test_chunk_layers_yields_each_chunks_layer_and_none_for_misses():
    store = MemoryLRUStore(1 << 20)
    (k1, kv1), (k2, kv2), (k3, _) = make_entry(0), make_entry(1), make_entry(2)
    store.put(k1, kv1)
    store.put(k2, kv2)
    layers = list(chunk_layers(store, [k1, k3, k2], num_layers=3))
    assert [layer for layer, _ in layers] == [0, 1, 2]
    for layer, per_chunk in layers:
        assert per_chunk[1] is None
        assert per_chunk[0][0].equal(kv1.k[layer]) and per_chunk[2][1].equal(kv2.v[layer])
