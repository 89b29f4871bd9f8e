"""An item-KV import's wait for an engine lock is reported apart from the transfer: a ranking's
`import_wait_ms` holds the exporting instance's wait for its engine lock (as far as the fetch
waited for it) and the importing instance's wait for its own, `import_ms` the rest (the
transfer itself). Two instances on one tiny model, without Ray: the object ref is the export
call itself (`Instance._fetch`)."""

from __future__ import annotations

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
    inst._fetch = lambda ref: ref()       # the export runs when the importer fetches it
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


def test_an_imports_lock_waits_are_reported_apart_from_the_transfer(tiny_loaded, synthetic,
                                                                    rank_bodies):
    owner, here = (_instance(k, tiny_loaded, synthetic) for k in (0, 1))
    try:
        body = {**rank_bodies[0], "method": "naive"}
        items = body["candidates"][:4]
        owner.host.build_items(items)

        def export():
            return owner.export_items(items)

        busy = _busy(owner.host.lock, 0.4)       # the exporting engine is busy
        st = here.rank(body, imports=[export])["stats"]
        busy.join()
        assert st["fetched_items"] == 4
        assert st["import_wait_ms"] >= 300       # waited for the owner's engine lock ...
        assert st["import_ms"] < st["import_wait_ms"]    # ... which is not the transfer
        assert st["actor_ms"] >= st["import_wait_ms"] + st["import_ms"] + st["lock_wait_ms"]

        busy = _busy(here.host.lock, 0.4)        # now the importing engine is busy
        st = here.rank({**body, "user_id": "another"}, imports=[export])["stats"]
        busy.join()
        assert st["fetched_items"] == 0          # held since the first import
        assert st["import_wait_ms"] >= 300 and st["import_ms"] < st["import_wait_ms"]
    finally:
        owner.host.close()
        here.host.close()
