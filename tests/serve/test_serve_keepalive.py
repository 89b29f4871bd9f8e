"""An idle keep-alive connection outlives the clients' pools: with uvicorn's default (5 s, the
same as httpx's pool expiry) a request sent on a connection the server was closing was lost
(ReadError) in a served sweep."""

import socket
import time

from fastapi import FastAPI

from rcllm.loadgen.client import KEEPALIVE_EXPIRY_S
from rcllm.serve.server import KEEP_ALIVE_S, start_in_thread

REQUEST = b"GET /ping HTTP/1.1\r\nHost: test\r\nConnection: keep-alive\r\n\r\n"


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"pong\""):
        chunk = sock.recv(4096)
        if not chunk:
            return data            # the server closed the connection
        data += chunk
    return data


def test_an_idle_connection_is_kept_longer_than_the_clients_keep_it():
    assert KEEPALIVE_EXPIRY_S < KEEP_ALIVE_S
    app = FastAPI()
    app.get("/ping")(lambda: "pong")
    running = start_in_thread(app)
    try:
        port = int(running.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(REQUEST)
            assert _answer(sock).startswith(b"HTTP/1.1 200")
            time.sleep(5.5)        # idle past uvicorn's default (5 s) and httpx's pool expiry
            sock.sendall(REQUEST)
            assert _answer(sock).startswith(b"HTTP/1.1 200")   # same connection still served
    finally:
        running.stop()
