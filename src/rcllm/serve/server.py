"""Running an app under uvicorn: in the foreground (the CLI) or on a thread (tests, bench)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from ..errors import RcllmError

# How long an idle keep-alive connection stays open. uvicorn's default (5 s) equals httpx's
# pool expiry (5 s): a client reusing a connection just as the server closes it gets a
# ReadError for a request the server never read (one such request was lost in the served
# sweep of 2026-12-04). Longer than the pools of common clients and load balancers (60 s).
KEEP_ALIVE_S = 75


@dataclass
class RunningServer:
    server: uvicorn.Server
    thread: threading.Thread
    url: str            # http://127.0.0.1:<port>

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                    timeout_s: float = 30.0) -> RunningServer:
    """Starts uvicorn on a daemon thread; port 0 = a free port. Returns once it listens."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           lifespan="on", timeout_keep_alive=KEEP_ALIVE_S))
    thread = threading.Thread(target=server.run, name="rcllm-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RcllmError(f"the HTTP server did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(server, thread, f"http://{host}:{bound}")
