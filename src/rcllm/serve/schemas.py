"""Pydantic models of the HTTP boundary (and nowhere else).

Static bounds here keep any one body small; the per-deployment limits (`ServeSettings`) are
checked in `app` and answered with the same error shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import METHODS

class HistoryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_id: str = Field(min_length=1, max_length=128)
    rating: float = Field(ge=0, le=5)
    review: str = Field(default="", max_length=20_000)
    timestamp: int = Field(ge=0, le=32_503_680_000)  # up to year 3000


class RankIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str = Field(min_length=1, max_length=128)
    history: list[HistoryIn] = Field(default_factory=list, max_length=1000)
    candidates: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=26)
    method: Literal[METHODS] | None = None  # type: ignore[valid-type]
    item_ratio: float | None = Field(default=None, ge=0, le=1)
    history_ratio: float | None = Field(default=None, ge=0, le=1)
    # explain: token-by-token sources, selection and TTFT parts (single-process backend);
    # compare (with explain): also full recompute's ranking, rank changes, KL, top-1 agreement
    explain: bool = False
    compare: bool = False


class PrewarmIn(BaseModel):
    """The user part of a /v1/rank body: the user side to compute ahead of the ranking."""
    model_config = ConfigDict(extra="forbid")
    user_id: str = Field(min_length=1, max_length=128)
    history: list[HistoryIn] = Field(default_factory=list, max_length=1000)


class PrewarmOut(BaseModel):
    tokens: int         # tokens of the user side (instruction + history window)
    computed: bool      # False: it was already in this instance's user-prefix cache
    instance: int = 0   # the instance that holds it now (where the user's rankings go)
    engine_ms: float = 0.0      # the engine's time on it (a look-up when it was cached)
    lock_wait_ms: float = 0.0   # behind other calls on that engine before it


class RankOut(BaseModel):
    ranking: list[str]
    scores: dict[str, float]
    method: str
    ttft_ms: float
    total_ms: float
    instance: int = 0
    stats: dict[str, Any]
    explain: dict[str, Any] | None = None   # with `explain` only (see serve/ui.py)


class ItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_id: str = Field(min_length=1, max_length=128)
    title: str = Field(min_length=1, max_length=1000)
    description: str = Field(default="", max_length=20_000)
    category: str = Field(default="", max_length=200)


class ItemsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[ItemIn] = Field(min_length=1, max_length=1024)


class ItemsAccepted(BaseModel):
    accepted: list[str]
    pending: int    # item builds not yet swapped in (all instances)


class ItemOut(BaseModel):
    item_id: str
    title: str
    description: str
    category: str
    pending: bool   # a newer version is being built; requests still see this one


class ErrorBody(BaseModel):
    field: str      # dotted path of the offending field, or "body" / "request"
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody
