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
    losses: list[str] = Field(description="The losses the family serves.")
    default_loss: str = Field(description="The loss a model of this family gets when its spec names none.")
    hyperparameters: dict[str, Any] = Field(description=(
        "The JSON Schema (2020-12) of the family's hyperparameters: each knob's type, default (x-default: how a "
        "default computed from the spec is found), range, description and when it applies; x-rules: the rules "
        "across fields that the service checks at creation. Also in the OpenAPI document as "
        "components/schemas/Hyperparameters_<name>."))


class AlgorithmList(BaseModel):
    items: list[Algorithm]
