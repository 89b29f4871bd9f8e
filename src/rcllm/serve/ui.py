"""The explain view (issue 19): `/v1/rank` with `explain`, the page at `/ui`, its user list.

One place computes what both the API and the page show: `explained` ranks the request with
`engine.rank(..., explain=True)` and, when asked, again with full recompute, and
`compare` turns the two score vectors into rank changes, KL and top-1 agreement. The page
(`static/ui.*`, plain HTML/CSS/JS, no build step, no CDN) is a thin view over that JSON.

Auth: the page shell and its static files hold no data and are served without the bearer
token (a browser cannot attach `Authorization` to a navigation); every request that returns
data (`/v1/rank`, `/v1/ui/users`) goes through the same bearer-token rule as the API: the
page asks for the token and sends it as `Authorization: Bearer` (see guard.OPEN_PATHS).
Explain runs on the single-process backend only (it needs the engine in this process).
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import METHODS
from ..errors import RcllmError
from ..report import UNTUNED_NOTE, compare, stylesheet
from ..records import Dataset, ItemId

if TYPE_CHECKING:                  # the app imports this module; torch only where it ranks
    from .host import EngineHost

STATIC = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}
MAX_USERS = 50          # dataset users listed on the page


def explained(host: EngineHost, payload: dict[str, Any]) -> dict[str, Any]:
    """`host.rank`'s answer plus `explain`: the engine's token-by-token data, the titles of
    the candidates and, with `compare`, full recompute's ranking of the same request (ranked
    after the method's, so its cache writes cannot help the method) and the comparison."""
    from ..prompt.builder import RankRequest
    from .host import history_of

    req = RankRequest(user_id=payload["user_id"], history=history_of(payload),
                      candidates=tuple(ItemId(c) for c in payload["candidates"]))
    overrides = {k: payload[k] for k in ("item_ratio", "history_ratio")
                 if payload.get(k) is not None}
    with host.lock:
        res = host.engine.rank(req, payload.get("method"), explain=True, **overrides)
        full = host.engine.rank(req, "full") if payload.get("compare") else None
        titles = {c: host.catalog[ItemId(c)].title for c in payload["candidates"]
                  if ItemId(c) in host.catalog}
    ex = dict(res.explain or {})
    ranking = [str(c) for c in res.ranking]
    scores = {str(k): float(v) for k, v in res.scores.items()}
    cands = [str(c) for c in ex.get("candidates", payload["candidates"])]
    ex["titles"] = titles
    ex["full"] = None if full is None else {
        "ranking": [str(c) for c in full.ranking],
        "scores": {str(k): float(v) for k, v in full.scores.items()},
        "ttft_ms": full.ttft_ms}
    ex.update(compare(ranking, scores, ex["full"] and ex["full"]["ranking"],
                      ex["full"] and ex["full"]["scores"], cands))
    return {"ranking": ranking, "scores": scores, "method": res.method, "ttft_ms": res.ttft_ms,
            "total_ms": res.total_ms, "stats": dict(res.stats), "explain": ex}


async def rank_explained(backend: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """`explained` through the backend's bounded queue; RcllmError on a Ray backend."""
    host, worker = getattr(backend, "host", None), getattr(backend, "worker", None)
    if host is None or worker is None:
        raise RcllmError("explain is served by the single-process backend only "
                         "(not with --instances)")
    fut = worker.submit(lambda: explained(host, payload))   # may raise Overloaded
    return {**(await asyncio.wrap_future(fut)), "instance": 0}


def user_requests(ds: Dataset | None, history_window: int, num_candidates: int,
                  limit: int = MAX_USERS) -> list[dict[str, Any]]:
    """Leave-last-out requests of the dataset's users (eval's protocol) as /v1/rank bodies."""
    if ds is None:
        return []
    from ..eval.protocol import build_cases

    cases = build_cases(ds, history_window=history_window,
                        num_negatives=max(num_candidates - 1, 0), seed=0, max_cases=limit)
    return [{"user_id": c.user_id, "target": c.target,
             "request": {"user_id": c.user_id, "candidates": [str(i) for i in c.candidates],
                         "history": [{"item_id": h.item_id, "rating": h.rating,
                                      "review": h.review, "timestamp": h.timestamp}
                                     for h in c.history]}}
            for c in sorted(cases, key=lambda c: c.user_id)]


def _static(name: str) -> str:
    if name == "ui.css":  # shared with eval's static report, so it lives below both
        return stylesheet()
    return resources.files("rcllm.serve").joinpath("static", name).read_text("utf-8")


def mount(app: FastAPI, backend: Any, max_candidates: int,
          dataset: Dataset | None = None, untuned: bool = False) -> None:
    """GET /ui, /ui/static/{name} (no data, open) and GET /v1/ui/users (guarded)."""
    cache: dict[str, Any] = {}

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(_static("ui.html"))

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in STATIC:
            raise StarletteHTTPException(404, f"no static file {name!r}")
        return Response(_static(name), media_type=STATIC[name])

    @app.get("/v1/ui/users")
    def users() -> dict:
        """The methods, the default method and the first users of the loaded dataset, each
        with a /v1/rank body (their leave-last-out request); empty without a dataset."""
        if "users" not in cache:
            host = getattr(backend, "host", None)
            cfg = host.engine.cfg if host is not None else None
            window = cfg.prompt.history_window if cfg is not None else 10
            cache["users"] = user_requests(dataset, window or 10, min(max_candidates, 10))
            cache["method"] = cfg.reuse.method if cfg is not None else None
        return {"methods": list(METHODS), "default_method": cache["method"],
                "explain": getattr(backend, "host", None) is not None, "users": cache["users"],
                "untuned": untuned, "note": UNTUNED_NOTE if untuned else None}
