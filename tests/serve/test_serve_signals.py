"""Stopping a server stops what it started (issue 30 item 5): `rcllm serve --redis-local`
(one engine, and 2 Ray instances) and `rcllm bench serve --redis-local` are sent SIGTERM (and
SIGHUP) as systemd, Docker and Kubernetes do; every process they started — the private
redis-server, Ray's GCS, raylet, agents and instance actors — must be gone once they exit.
Before the fix, `serve --redis-local` exited on SIGTERM and left valkey-server with parent 1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from serve_helpers import LAUNCH

BENCH_LAUNCH = ("import argparse, sys; from rcllm.commands.bench_serve import register_bench; "
                "p = argparse.ArgumentParser(); register_bench(p.add_subparsers()); "
                "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (so a reused pid is not mistaken for it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, tuple[str, str]]:
    """Every process below `pid`: {pid: (start time, command line)}."""
    kids, out, todo = _children(), {}, [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            try:
                with open(f"/proc/{child}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            start = _start_time(child)
            if start is not None:
                out[child] = (start, cmd)
                todo.append(child)
    return out


def survivors(before: dict[int, tuple[str, str]], grace_s: float = 15.0) -> list[str]:
    """Those of `before` still running after `grace_s` (the same pid and start time)."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [cmd for pid, (start, cmd) in before.items() if _start_time(pid) == start]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _kill(leftover: dict[int, tuple[str, str]]) -> None:
    """Test hygiene after a failure: stop what the test's server left (by pid, checked)."""
    for pid, (start, _cmd) in leftover.items():
        if _start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_and_check(proc: subprocess.Popen, sig: int) -> None:
    before = descendants(proc.pid)
    assert any("valkey" in c or "redis" in c for _s, c in before.values()), before
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=120)
    finally:
        left = survivors(before)
        _kill(before)
    assert left == [], f"outlived the server: {left}"
    assert rc != -sig, rc          # handled (an exit code), not killed by the signal


def _serve(tiny_model_dir, *options: str):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "serve", "--port", str(port),
                             "--redis-local", "--set", f"model.path={tiny_model_dir}",
                             "--set", "model.threads=1", *options],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("server did not start")
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_serve_redis_local_stops_its_redis(tiny_model_dir, sig):
    _stop_and_check(_serve(tiny_model_dir), sig)


def test_serve_ray_instances_stop_with_sigterm(tiny_model_dir):
    proc = _serve(tiny_model_dir, "--instances", "2", "--profile", "builtin")
    assert sum("ray::" in c for _s, c in descendants(proc.pid).values()) >= 2
    _stop_and_check(proc, signal.SIGTERM)


def test_bench_serve_stops_redis_and_ray_with_sigterm(tiny_model_dir):
    """SIGTERM while the bench's load runs (2 Ray instances up, requests in flight)."""
    proc = subprocess.Popen([sys.executable, "-c", BENCH_LAUNCH, "serve", "--configs",
                             "2:affinity", "--requests", "40", "--candidates", "6", "--qps", "1",
                             "--redis-local", "--warmup", "2",
                             "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while sum("ray::Instance" in c for _s, c in descendants(proc.pid).values()) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "bench did not start"
        time.sleep(0.2)
    time.sleep(8)               # instances built, the HTTP server up, the load under way
    assert proc.poll() is None
    _stop_and_check(proc, signal.SIGTERM)


def test_a_sigkilled_server_leaves_no_redis_or_ray_process(tiny_model_dir):
    """SIGKILL cannot be handled: the Redis server goes by its parent-death signal; Ray starts
    GCS, raylet and workers sharing the driver's fate, and its two agents exit once they see
    the raylet gone (61 s after the kill, measured with Ray 2.60)."""
    proc = _serve(tiny_model_dir, "--instances", "2", "--profile", "builtin")
    before = descendants(proc.pid)
    assert sum("ray::" in c for _s, c in before.values()) >= 2
    assert any("valkey" in c or "redis" in c for _s, c in before.values()), before
    proc.kill()
    proc.wait(timeout=30)
    try:
        left = survivors(before, grace_s=150.0)
    finally:
        _kill(before)
    assert left == [], f"outlived the SIGKILLed server: {left}"
