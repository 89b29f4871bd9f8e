"""The FastAPI app: translates HTTP to a `Backend` and errors to JSON that names the field.

Error body everywhere: {"error": {"field": <dotted path | "body" | "request">, "message": ...}}.
422 = the body breaks the schema or a limit, 400 = the engine refused the request (unknown
candidate, prompt over the context), 429 = queue full (Retry-After set), 401/411/413 from
`guard`. A 5xx is a bug.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..errors import RcllmError
from ..records import Dataset, Item, ItemId
from ..report import UNTUNED_NOTE
from . import ui
from .backend import Backend
from .guard import Guard
from .metrics import Metrics
from .schemas import (ErrorOut, ItemOut, ItemsAccepted, ItemsIn, PrewarmIn, PrewarmOut, RankIn,
                      RankOut)
from .settings import ServeSettings
from .worker import Overloaded, Unavailable

# engine messages → the request field they are about (first match wins)
FIELD_HINTS = (("candidate", "candidates"), ("prompt has", "history"),
               ("item_ratio", "item_ratio"), ("history_ratio", "history_ratio"),
               ("method", "method"), ("prewarm", "request"))
ERRORS = {c: {"model": ErrorOut} for c in (400, 401, 404, 411, 413, 422, 429)}


class BadField(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def error(status: int, field: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status, headers=headers)


def field_of(message: str) -> str:
    low = message.lower()
    return next((f for hint, f in FIELD_HINTS if hint in low), "body")


def create_app(backend: Backend, settings: ServeSettings, own_backend: bool = True,
               dataset: Dataset | None = None, untuned: bool = False) -> FastAPI:
    """The app over `backend`; closes the backend on shutdown when it owns it. `dataset`: the
    loaded data whose users the page at /ui lists (ui.py). `untuned`: the engines serve the
    base model without an adapter; /healthz and the page say so (report.UNTUNED_NOTE)."""
    settings.validate()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        if own_backend:
            backend.close()

    app = FastAPI(title="rcllm", version="0.1.0", lifespan=lifespan,
                  description="LLM recommendation ranking with beyond-prefix KV reuse")
    metrics = Metrics(backend.queue_depth, backend.pending,
                      getattr(backend, "store_stats", None),
                      getattr(backend, "user_prefix_stats", None),
                      getattr(backend, "tier_stats", None))
    app.state.metrics = metrics
    _install_handlers(app, metrics)
    _request_routes(app, backend, settings, metrics)
    _item_routes(app, backend, settings)
    _health_routes(app, backend, metrics, untuned)
    ui.mount(app, backend, settings.max_candidates, dataset, untuned)
    app.add_middleware(Guard, max_body_bytes=settings.max_body_bytes, token=settings.token,
                       count=lambda ep, status: metrics.requests.labels(ep, str(status)).inc())
    return app


def _request_routes(app: FastAPI, backend: Backend, settings: ServeSettings,
                    metrics: Metrics) -> None:
    """/v1/rank and /v1/prewarm: the engine's calls, within the request timeout."""

    @app.post("/v1/rank", response_model=RankOut, responses=ERRORS)
    async def rank(body: RankIn) -> RankOut:
        if len(body.candidates) > settings.max_candidates:
            raise BadField("candidates", f"{len(body.candidates)} candidates, at most "
                                         f"{settings.max_candidates}")
        if len(set(body.candidates)) != len(body.candidates):
            raise BadField("candidates", "the candidate list names an item twice")
        call = (lambda p: ui.rank_explained(backend, p)) if body.explain else backend.rank
        out = await engine_call(call, body)
        metrics.observe_rank(out)
        return RankOut(**out)

    @app.post("/v1/prewarm", response_model=PrewarmOut, responses=ERRORS)
    async def prewarm(body: PrewarmIn) -> PrewarmOut:
        """RelayGR pre-inference: the user side of the user's next /v1/rank, computed now on
        the instance that ranking will go to (pointwise scorer only; else 400)."""
        out = await engine_call(backend.prewarm, body)
        metrics.observe_prewarm(out)
        return PrewarmOut(**out)

    async def engine_call(call, body):
        """`call(body as plain data)` within the request timeout, after the history limit."""
        if len(body.history) > settings.max_history:
            raise BadField("history", f"{len(body.history)} history entries, at most "
                                      f"{settings.max_history}")
        try:
            return await asyncio.wait_for(call(body.model_dump()), settings.request_timeout_s)
        except asyncio.TimeoutError:
            raise StarletteHTTPException(504, "the request timed out") from None


def _item_routes(app: FastAPI, backend: Backend, settings: ServeSettings) -> None:
    # Handlers that may block (the engine lock, ray.get) are plain `def`: FastAPI runs them in
    # its thread pool, so the event loop (and /healthz) never waits on an engine call.
    @app.put("/v1/items", response_model=ItemsAccepted, status_code=202, responses=ERRORS)
    def put_items(body: ItemsIn) -> ItemsAccepted:
        if len(body.items) > settings.max_items_per_put:
            raise BadField("items", f"{len(body.items)} items, at most "
                                    f"{settings.max_items_per_put} per request")
        items = [Item(ItemId(i.item_id), i.title, i.description, i.category) for i in body.items]
        pending = backend.submit_items(items)
        return ItemsAccepted(accepted=[i.item_id for i in items], pending=pending)

    @app.get("/v1/items/{item_id}", response_model=ItemOut, responses=ERRORS)
    def get_item(item_id: str) -> ItemOut:
        item, pending = backend.get_item(item_id)
        if item is None and not pending:
            raise StarletteHTTPException(404, f"unknown item {item_id!r}")
        if item is None:
            return ItemOut(item_id=item_id, title="", description="", category="", pending=True)
        return ItemOut(item_id=item.item_id, title=item.title, description=item.description,
                       category=item.category, pending=pending)

    @app.delete("/v1/items/{item_id}", status_code=204, responses=ERRORS)
    def delete_item(item_id: str) -> Response:
        if not backend.delete_item(item_id):
            raise StarletteHTTPException(404, f"unknown item {item_id!r}")
        return Response(status_code=204)


def _health_routes(app: FastAPI, backend: Backend, metrics: Metrics, untuned: bool) -> None:
    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "untuned": untuned, "note": UNTUNED_NOTE if untuned else None}

    @app.get("/readyz", responses={503: {"model": ErrorOut}})
    def readyz() -> Response:
        if backend.ready():
            return JSONResponse({"ready": True, "queue_depth": backend.queue_depth()})
        return error(503, "request", "not ready")

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")


def _install_handlers(app: FastAPI, metrics: Metrics) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"] or ["body"]
        return error(422, ".".join(loc), str(first.get("msg", "invalid")))

    @app.exception_handler(BadField)
    async def bad_field(_req: Request, exc: BadField) -> JSONResponse:
        return error(422, exc.field, str(exc))

    @app.exception_handler(RcllmError)
    async def refused(_req: Request, exc: RcllmError) -> JSONResponse:
        return error(400, field_of(str(exc)), str(exc))

    @app.exception_handler(Overloaded)
    async def overloaded(_req: Request, exc: Overloaded) -> JSONResponse:
        metrics.rejected.inc()
        return error(429, "request", str(exc), {"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(Unavailable)
    async def unavailable(_req: Request, exc: Unavailable) -> JSONResponse:
        return error(503, "request", str(exc), {"Retry-After": "5"})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(req))}
        return error(exc.status_code, "request", str(exc.detail), headers)


def allowed_methods(req: Request) -> list[str]:
    """Every method some route serves at this path (Starlette's own 405 names only the first
    route's, e.g. GET for /v1/items/{id} although DELETE is served too)."""
    methods: set[str] = set()
    for route in req.app.router.routes:
        match, _ = route.matches(req.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)
