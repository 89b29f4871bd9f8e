"""An item-KV import costs the importing request at most what it saves, and its waits are
reported apart from the transfer. The owners export while the request queues for its own
engine; once that engine is free the request waits for a late export at most `import_wait_ms`
(the router's price of recomputing instead), stores what arrived under the same hold of its
engine lock as the ranking (one wait in its engine's line, not two), and recomputes the rest.
Two instances on one tiny model, without Ray: an export is a future run on a thread pool."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

from rcllm.config import RcllmConfig
from rcllm.engine import Engine
from rcllm.serve.host import EngineHost
from rcllm.serve.instance import Instance


def _instance(index: int, tiny_loaded, synthetic) -> Instance:
    inst = object.__new__(Instance)       # Instance() builds its engine from a spec
    inst.index, inst.built = index, 0
    inst.host = EngineHost(Engine(tiny_loaded, dict(synthetic.items), RcllmConfig()))
    inst._fetch = lambda ref: ref.result()

    def arrived(refs, timeout_s):
        done, _ = cf.wait(refs, timeout=timeout_s)
        return [r for r in refs if r in done]

    inst._arrived = arrived
    return inst


def _busy(lock: threading.Lock, seconds: float) -> threading.Thread:
    """Holds `lock` for `seconds` from another thread (returns once it is held)."""
    held = threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            time.sleep(seconds)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    held.wait()
    return t


def test_an_import_waits_for_the_owner_at_most_what_it_saves(tiny_loaded, synthetic,
                                                             rank_bodies):
    owner = _instance(0, tiny_loaded, synthetic)
    fresh = []              # an importer per case: a ranking stores its candidates' KV after

    def importer() -> Instance:
        fresh.append(_instance(len(fresh) + 1, tiny_loaded, synthetic))
        return fresh[-1]

    pool = cf.ThreadPoolExecutor(2)
    try:
        body = {**rank_bodies[0], "method": "naive"}
        items = body["candidates"][:2]
        owner.host.build_items(items)
        export = lambda: pool.submit(owner.export_items, items)   # noqa: E731

        # the owner is busy 0.4 s and the import saves 50 ms: not waited for, recomputed
        here = importer()
        busy = _busy(owner.host.lock, 0.4)
        st = here.rank(body, imports=[export()], import_wait_ms=50)["stats"]
        assert (st["fetched_items"], st["imports_late"]) == (0, 1)
        assert 30 <= st["import_wait_ms"] < 300
        busy.join()

        # the owner is busy 0.4 s and the import saves 1 s: waited for, then stored
        here = importer()
        busy = _busy(owner.host.lock, 0.4)
        st = here.rank(body, imports=[export()], import_wait_ms=1000)["stats"]
        busy.join()
        assert (st["fetched_items"], st["imports_late"]) == (2, 0)
        assert st["import_wait_ms"] >= 300            # this engine waited for the owner ...
        assert st["import_ms"] < st["import_wait_ms"]     # ... which is not the transfer
        assert st["import_owner_wait_ms"] >= 300
        assert st["actor_ms"] >= st["import_wait_ms"] + st["import_ms"] + st["lock_wait_ms"]

        # the importing engine is busy 0.4 s: the export arrives while the request queues,
        # so the request waits in its own line once, and not for the import
        here = importer()
        busy = _busy(here.host.lock, 0.4)
        st = here.rank(body, imports=[export()], import_wait_ms=1000)["stats"]
        busy.join()
        assert (st["fetched_items"], st["imports_late"]) == (2, 0)
        assert st["lock_wait_ms"] >= 300 and st["import_wait_ms"] < 100

        # no imports: the fields are there, zero
        st = importer().rank(body)["stats"]
        assert (st["fetched_items"], st["imports_late"], st["import_wait_ms"]) == (0, 0, 0)
    finally:
        pool.shutdown()
        for inst in [owner, *fresh]:
            inst.host.close()
