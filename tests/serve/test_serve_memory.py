"""Bounded load measured in the server's own process: `rcllm serve` runs as a subprocess, and
its resident memory (VmRSS, sampled while the load runs) is compared with its own post-warm-up
value — not the peak of the test process, which already holds a model."""

from __future__ import annotations

import threading

from serve_helpers import serve_process

from rcllm.loadgen.client import run_load


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_load_far_over_capacity_is_bounded_in_the_server_process(tiny_model_dir, rank_bodies):
    """3 waves of 40 simultaneous requests on a queue of 2: every answer is 200 or 429, and
    the server's RSS stays within 10% of its post-warm-up RSS."""
    with serve_process("--queue-size", "2", "--set", f"model.path={tiny_model_dir}",
                       "--set", "model.threads=1") as (url, proc):
        bodies = [rank_bodies[k % len(rank_bodies)] for k in range(40)]
        for _ in range(2):                           # warm-up: every body's chunks cached
            for body in rank_bodies:
                assert run_load(url, [body], qps=1.0)["ok"] == 1
        base = rss_kib(proc.pid)
        peak = [base]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.01):
                peak[0] = max(peak[0], rss_kib(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        results = [run_load(url, bodies, qps=1000.0) for _ in range(3)]
        stop.set()
        sampler.join()
        after = rss_kib(proc.pid)
    for res in results:
        assert res["failed"] == 0 and res["ok"] + res["rejected_429"] == 40, res
        assert res["ok"] >= 2 and res["rejected_429"] >= 1, res
    print(f"server RSS: {base / 1024:.1f} MiB after warm-up, peak {peak[0] / 1024:.1f} MiB "
          f"under load, {after / 1024:.1f} MiB after")
    assert peak[0] < 1.10 * base, (base, peak[0])
    assert after < 1.10 * base, (base, after)
