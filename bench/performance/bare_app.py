"""The HTTP/JSON ceiling for section 2: a bare FastAPI app whose learn endpoint only parses and validates the
same per-example body with pydantic ``list[float]`` models (no auth, no database, no engine)."""
from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

Finite = Annotated[float, Field(allow_inf_nan=False)]


class Example(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, Field(min_length=1, max_length=256)]
    x: list[Finite]
    y: Finite


class LearnRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    examples: list[Example] = Field(min_length=1)


app = FastAPI()


@app.post("/learn")
def learn(body: LearnRequest):
    return {"accepted": len(body.examples)}
