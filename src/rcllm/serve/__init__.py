"""Serving: the HTTP API over one engine (single process) or over K Ray instance actors.

Layering: `app` (FastAPI) only translates HTTP to a `Backend` (`local.LocalBackend` or
`ray_backend.RayBackend`); backends talk to `rcllm.engine.Engine` through `host.EngineHost`.
Pydantic lives in `schemas` only. No module here is imported by the model code.
"""
