"""Stopping `rcllm serve` and `rcllm bench serve` stops what they started (issue 30 item 5).

SIGTERM is how systemd, Docker and Kubernetes stop a service. Python's default action for it
ends the process at once: no `finally`, no atexit, so a private redis-server (and, before Ray
installs its own handler, Ray's processes) outlived the server with parent 1. uvicorn makes
it worse in the foreground: it catches SIGTERM, shuts down gracefully, then raises the signal
again under the handler that was there before it — the default one, which kills the process
before `run`'s `finally` stops Redis. SIGINT worked because its default handler raises
KeyboardInterrupt.

`stop_signals_exit()` installs, for the main thread, a handler that turns SIGTERM and SIGHUP
into `SystemExit(128 + signum)`, so every `finally` and atexit hook runs (Redis stopped, the
Ray backend closed, `ray.shutdown` killing its processes). A repeated signal while stopping is
ignored, so it cannot cut the clean-up short. The previous handlers come back on exit.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop(signum: int, _frame) -> None:
    if signum == signal.SIGHUP and signal.getsignal(signal.SIGTERM) not in (_stop, signal.SIG_IGN):
        # another handler owns SIGTERM (uvicorn's, while it serves): SIGHUP takes SIGTERM's
        # path, a graceful shutdown and then SIGTERM under this handler. A SystemExit raised
        # here could land in code that swallows it, and the server would serve on with both
        # signals ignored (the suspected cause of one CI hang on a loaded machine: SIGHUP,
        # no exit in 120 s)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.raise_signal(signal.SIGTERM)
        return
    for sig in STOP_SIGNALS:          # stopping now: a second signal must not cut it short
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def install() -> bool:
    """Installs the stop handler (main thread only; False elsewhere). Call it again after
    something else replaced it (`ray.init` sets its own SIGTERM handler)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
    return True


@contextlib.contextmanager
def stop_signals_exit() -> Iterator[None]:
    """SIGTERM / SIGHUP raise SystemExit inside the block; the old handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    install()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
