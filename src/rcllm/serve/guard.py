"""ASGI middleware in front of every route: body size, bearer token, request counting.

Bodies are limited by their declared Content-Length (a POST/PUT without one gets 411), so an
oversized body is refused before any of it is read or parsed.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Callable

# no token: probes, and the page shell of /ui with its static files (they hold no data; the
# page sends the bearer token on every data request, see serve/ui.py)
OPEN_PATHS = ("/healthz", "/readyz", "/ui", "/ui/static/ui.css", "/ui/static/ui.js")


def endpoint_label(path: str) -> str:
    """A bounded-cardinality label for the request counter."""
    if path.startswith("/v1/items/"):
        return "/v1/items/{item_id}"
    known = ("/v1/rank", "/v1/items", "/healthz", "/readyz", "/metrics", "/openapi.json", "/docs",
             "/ui", "/v1/ui/users")
    return path if path in known else "other"


class Guard:
    def __init__(self, app: Any, max_body_bytes: int, token: str | None,
                 count: Callable[[str, int], None]) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.token = token
        self.count = count

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        label = endpoint_label(scope["path"])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, field, message, extra = refusal
            self.count(label, status)
            await _send_json(send, status, {"error": {"field": field, "message": message}}, extra)
            return
        status_seen = {"status": 500}

        async def send_counted(msg) -> None:
            if msg["type"] == "http.response.start":
                status_seen["status"] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            self.count(label, status_seen["status"])

    def _refusal(self, scope, headers: dict[str, str]):
        if self.token and scope["path"] not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            if not hmac.compare_digest(auth.encode(), f"Bearer {self.token}".encode()):
                return 401, "authorization", "missing or wrong bearer token", \
                    [(b"www-authenticate", b"Bearer")]
        if scope["method"] in ("POST", "PUT", "PATCH"):
            length = headers.get("content-length")
            if length is None:
                return 411, "content-length", "a request body needs a Content-Length", []
            if not length.isdigit():
                return 400, "content-length", "Content-Length must be a number", []
            if int(length) > self.max_body_bytes:
                return 413, "body", f"body of {length} bytes over the limit of " \
                                    f"{self.max_body_bytes}", []
        return None


async def _send_json(send, status: int, body: dict, extra: list) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *extra]})
    await send({"type": "http.response.body", "body": data})
