"""Serving limits and options: one frozen dataclass, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RcllmError


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"         # loopback by default; another address is an explicit choice
    port: int = 8000
    queue_size: int = 8             # requests admitted (waiting + running) per instance
    max_body_bytes: int = 1 << 20   # larger request bodies get 413 before they are parsed
    max_candidates: int = 20        # at most prompt.max_candidates (labels A..Z)
    max_history: int = 200          # entries per request (the engine keeps the newest window)
    max_items_per_put: int = 256
    token: str | None = None        # bearer token; None = no authentication
    request_timeout_s: float = 120.0

    def validate(self) -> None:
        if self.queue_size < 1:
            raise RcllmError("serve queue size must be >= 1")
        if not 1 <= self.max_candidates <= 26:
            raise RcllmError("serve max candidates must be within 1..26")
        if self.max_body_bytes < 1024 or self.max_history < 0 or self.max_items_per_put < 1:
            raise RcllmError("serve limits must be positive (body >= 1 KiB)")
        if not 0 <= self.port <= 65535:
            raise RcllmError(f"bad port {self.port}")
