"""Helpers of the serving tests: `rcllm serve` as a process of its own."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

import httpx


LAUNCH = ("import argparse, sys; from rcllm.commands.serve import register; "
          "p = argparse.ArgumentParser(); register(p.add_subparsers(), None); "
          "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")


@contextlib.contextmanager
def serve_process(*options: str, start_s: float = 90.0):
    """`rcllm serve <options>` as its own process on a free loopback port; yields (url,
    Popen) once /readyz answers 200, terminates it on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "serve", "--port", str(port),
                             *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
