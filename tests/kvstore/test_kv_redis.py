import time

import pytest
from pathlib import Path

from kv_helpers import make_entry, same

from rcllm.errors import RcllmError
from rcllm.kvstore.base import ChunkKV, MemoryLRUStore
from rcllm.kvstore.codec import encode_checked
from rcllm.kvstore.redis_server import free_port
from rcllm.kvstore.redis_store import RedisStore
from rcllm.kvstore.tiered import TieredStore


def test_put_get_and_validation(redis_server, check):
    store = RedisStore(port=redis_server.port, check=check)
    key, kv = make_entry(0)
    store.put(key, kv)
    assert same(store.get(key), kv) and store.contains(key)
    assert len(store) == 1 and store.nbytes > kv.nbytes
    data = bytearray(encode_checked(key, kv, "raw", check))
    data[-1] ^= 0x10
    store.put_raw(key, bytes(data))
    assert store.get(key) is None and store.corrupt == 1
    assert not store.contains(key)  # the corrupt entry was deleted
    store.check_invariants()
    store.close()


def test_unreachable_redis_is_a_counted_miss(check):
    store = RedisStore(port=free_port(), check=check, socket_timeout_s=0.1, retry_after_s=60)
    key, kv = make_entry(1)
    store.put(key, kv)               # dropped, counted
    assert store.get(key) is None    # circuit open: no second timeout
    assert store.errors == 1 and store.skipped >= 1
    store.check_invariants()


def test_killed_mid_run_tiered_store_keeps_working(redis_server, check):
    redis = RedisStore(port=redis_server.port, check=check, socket_timeout_s=0.2,
                       retry_after_s=0.05)
    store = TieredStore(MemoryLRUStore(capacity_bytes=1 << 20), [redis])
    computed = []

    def compute(kv: ChunkKV):
        def fn():
            computed.append(kv.token_ids)
            return kv
        return fn

    before = [make_entry(i) for i in range(4)]
    for key, kv in before:
        assert same(store.get_or_compute(key, compute(kv)), kv)
    store.flush()
    assert len(computed) == 4 and len(redis) == 4
    store.memory = MemoryLRUStore(capacity_bytes=1 << 20)  # a fresh process: only Redis has them
    assert same(store.get(before[0][0]), before[0][1]) and store.hits_by_tier[1] == 1

    redis_server.stop()  # SIGKILL, as in a crash
    after = [make_entry(10 + i) for i in range(4)]
    for key, kv in after + before[1:]:
        time.sleep(0.06)  # let the circuit close again so every call really hits the dead server
        assert same(store.get_or_compute(key, compute(kv)), kv)
    store.flush()
    assert len(computed) == 4 + 4 + 3  # everything Redis held is recomputed, nothing fails
    assert redis.errors >= 1 and store.write_errors == 0
    store.check_invariants()
    store.close()


def test_slow_redis_times_out_into_a_miss(check):
    """A server that accepts connections but never answers: reads hit the socket timeout."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        store = RedisStore(port=silent.getsockname()[1], check=check, socket_timeout_s=0.1,
                           retry_after_s=60)
        tiered = TieredStore(MemoryLRUStore(capacity_bytes=1 << 20), [store])
        key, kv = make_entry(7)
        assert tiered.get(key) is None and store.errors == 1
        assert same(tiered.get_or_compute(key, lambda: kv), kv)
        tiered.close()
        assert store.skipped >= 1 and tiered.computes == 1


def test_a_sigkilled_parent_takes_its_redis_server_with_it(redis_server):
    """SIGKILL cannot be handled: the server started on the main thread must still not outlive
    the process that started it (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys

    code = ("import sys, time\n"
            "from rcllm.kvstore.redis_server import RedisServer\n"
            "srv = RedisServer().start()\n"
            "print(srv.proc.pid, flush=True)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    server_pid = int(child.stdout.readline())
    os.kill(server_pid, 0)               # it runs
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        # a zombie still answers kill(0) until its new parent (init) reaps it
        if Path(f"/proc/{server_pid}/stat").read_text().split()[2] == "Z":
            return
        time.sleep(0.05)
    os.kill(server_pid, signal.SIGKILL)
    raise AssertionError("the redis server outlived its SIGKILLed parent")


def test_a_capped_server_evicts_the_least_recent_entries(check):
    from rcllm.kvstore.redis_server import RedisServer

    key0, kv0 = make_entry(0, num_tokens=512)
    size = len(encode_checked(key0, kv0, "raw", check))     # ~100 kB
    # the server's own ~1 MB and room for about ten entries: forty written, the oldest go
    with RedisServer(max_bytes=2_000_000 + 4 * size) as srv:
        store = RedisStore(port=srv.port, check=check)
        keys = []
        for i in range(40):
            key, kv = make_entry(i, num_tokens=512)
            store.put(key, kv)
            keys.append(key)
        held = [k for k in keys if store.contains(k)]
        assert 0 < len(held) < len(keys)
        assert store.contains(keys[-1])            # the newest survives
        store.close()
    with pytest.raises(RcllmError, match="positive"):
        RedisServer(max_bytes=0)
