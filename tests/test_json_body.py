"""``app.api.json_body`` (orjson + pydantic) answers every body exactly as a FastAPI body parameter does:
same status, same error types and locations (checked against FastAPI itself, so a FastAPI upgrade that changes
its answers shows up here)."""
from __future__ import annotations

import json
from typing import Annotated

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from app.api import problems
from app.api.json_body import json_body
from app.schemas import PredictRequest, UnlearnRequest


def _app() -> FastAPI:
    app = FastAPI()
    problems.install(app)

    @app.post("/fastapi/predict")
    def fastapi_predict(body: PredictRequest):
        return body.model_dump()

    @app.post("/ours/predict")
    def ours_predict(body: Annotated[PredictRequest, Depends(json_body(PredictRequest))]):
        return body.model_dump()

    @app.post("/fastapi/unlearn")
    def fastapi_unlearn(body: UnlearnRequest):
        return body.model_dump()

    @app.post("/ours/unlearn")
    def ours_unlearn(body: Annotated[UnlearnRequest, Depends(json_body(UnlearnRequest))]):
        return body.model_dump()

    return app


client = TestClient(_app())


def _answer(r):
    body = r.json()
    if r.status_code >= 400:
        return r.status_code, body["type"], [(e["loc"], e["type"]) for e in body.get("errors", [])]
    return r.status_code, body


def _same(route: str, raw: bytes, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type is not None else {}
    theirs = client.post(f"/fastapi/{route}", content=raw, headers=headers)
    ours = client.post(f"/ours/{route}", content=raw, headers=headers)
    assert _answer(ours) == _answer(theirs), (route, raw[:100], content_type)


CASES = [b'{"x":[[0.1,0.2]]}', b"", b"null", b"[1]", b'{"x":[[NaN,0.2]]}', b'{"x":[[1e400,0.2]]}',
         b'{"x":[[' + b"1" * 400 + b",0.2]]}", b'{"x":[[0.1,0.2]],"y":1}', b'{"x":[[0.1,0.2]]', b"\xff\xfe",
         b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 2000 + b"1" + b"}" * 2000, b'{"x":[["0.1",true]]}',
         '{"x":[[0.1]],"\\ud800":1}'.encode(), '{"ids":["\\ud800"]}'.encode(), b'{"ids":[]}', b'{"ids":["a","b"]}',
         b'{"ids":[1]}', b'{"ids":["r1"],"examples":[{"id":"r1","x":[0.1],"y":1}]}', b'{"ids":["a"],"ids":["b"]}',
         b'{"x":[]}', b'{"x":[[]]}', b"  {\"ids\": [\"a\"]}  ", "{\"ids\":[\"é\"]}".encode("utf-16")]
TYPES = [None, "application/json", "application/json; charset=utf-8", "Application/JSON", "application/foo+json",
         "text/plain", "application", "multipart/form-data", "application/x-www-form-urlencoded", ""]


@pytest.mark.parametrize("route", ["predict", "unlearn"])
@pytest.mark.parametrize("raw", CASES)
def test_same_answers_as_fastapi(route, raw):
    for content_type in TYPES:
        _same(route, raw, content_type)


json_values = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                               st.sampled_from(["x", "ids", "examples", "id", "y", "z"]), inner, max_size=3),
                           max_leaves=12)


@given(value=json_values, route=st.sampled_from(["predict", "unlearn"]))
def test_same_answers_on_arbitrary_json(value, route):
    _same(route, json.dumps(value).encode(), "application/json")
