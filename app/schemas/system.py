"""Problems (RFC 9457), health and the algorithm list.  Field names are part of the contract (API.md)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


from .models import (Guarantee)


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class Algorithm(BaseModel):
    name: str
    accounting: str
    needs_retained_data: bool
    guarantee: Guarantee


class AlgorithmList(BaseModel):
    items: list[Algorithm]
