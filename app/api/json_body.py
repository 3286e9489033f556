"""JSON request bodies decoded with orjson and validated by pydantic, answering as FastAPI's own body parameters do.

FastAPI decodes a body parameter with the standard library (``json.loads``, after parsing the content type with
``email.message``); this does the same work faster with the same answers: a non-JSON or missing content type or
an empty body fail validation (422), undecodable JSON is 422 ``json_invalid``, anything else unreadable is 400.
The route documents the body with ``openapi_body(model)`` (FastAPI does not see it as a parameter).
"""
from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException


INLINE_BODY_BYTES = 16_384  # larger bodies are decoded on a worker thread in the tenant's turn (issue 37, F5-G)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    maintype, _, subtype = content_type.partition(";")[0].strip().lower().partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


def _decode(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # what orjson refuses, the standard library may accept (NaN, big integers, lone surrogates): as before
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}]) from None
    except Exception:  # noqa: BLE001 - e.g. RecursionError on deep nesting
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from None


def parse(model: type[BaseModel], raw: bytes, content_type: str | None) -> BaseModel:
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    obj = _decode(raw) if _is_json(content_type) else raw  # not JSON: the bytes fail validation, as in FastAPI
    try:
        return model.model_validate(obj, from_attributes=True)  # as FastAPI validates bodies
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def json_body(model: type[BaseModel]):
    """A dependency returning the request body as ``model``."""

    async def dependency(request: Request) -> BaseModel:
        return parse(model, await request.body(), request.headers.get("content-type"))

    return dependency


def openapi_body(model: type[BaseModel]) -> dict:
    """The requestBody FastAPI would document for a body parameter of type ``model``."""
    return {"requestBody": {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                            "required": True}}
