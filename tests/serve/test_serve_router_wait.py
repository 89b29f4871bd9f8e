"""The router's wait for a call: a busy instance that keeps answering other calls is waited
for; one that answers nothing for `call_timeout_s` times out (then it is made suspect)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import pytest

from rcllm.serve.health import wait_answer
from rcllm.serve.views import LiveInstance


class _Ref:
    def __init__(self, fut: Future) -> None:
        self._fut = fut

    def future(self) -> Future:
        return self._fut


def test_a_call_queued_on_a_busy_instance_is_waited_for():
    inst, fut = LiveInstance(0, set()), Future()
    stop = threading.Event()

    def busy():                                 # other calls keep finishing every 0.1 s
        while not stop.wait(0.1):
            inst.last_answer_s = time.monotonic()

    threading.Thread(target=busy, daemon=True).start()
    threading.Timer(1.0, lambda: fut.set_result({"ok": 1})).start()
    t0 = time.monotonic()
    assert asyncio.run(wait_answer(inst, _Ref(fut), 0.3)) == {"ok": 1}
    stop.set()
    assert time.monotonic() - t0 >= 0.9         # three call timeouts went by meanwhile


def test_a_call_on_an_instance_that_answers_nothing_times_out():
    inst = LiveInstance(0, set())
    inst.last_answer_s -= 10                    # its last answer was long ago
    t0 = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(wait_answer(inst, _Ref(Future()), 0.3))
    assert 0.25 <= time.monotonic() - t0 < 1.0
