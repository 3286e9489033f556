"""The OpenAPI document states the rules the service enforces on a request's shape (issue 21 item 6).

For each rule, requests on both sides of it are checked against the committed document (jsonschema, draft 2020-12)
and sent to the service: what the document refuses the service refuses (422, nothing changed), what it accepts the
service accepts.  tests/test_schemathesis.py fuzzes every operation with the same expectation.
"""
from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from app.openapi_dump import OUT
from app.unlearning import ALGORITHMS

from .helpers import create_model, examples, learned_model, unit_rows

DOC = json.loads(OUT.read_text())
_REGISTRY = Registry().with_resource("urn:olu", Resource.from_contents({**DOC, "$schema": "https://json-schema.org/draft/2020-12/schema"}))


def valid(component: str, instance) -> bool:
    return Draft202012Validator({"$ref": f"urn:olu#/components/schemas/{component}"},
                                registry=_REGISTRY).is_valid(instance)


def header_schema(path: str, name: str = "Idempotency-Key") -> dict:
    params = DOC["paths"][path]["post"]["parameters"]
    return next(p["schema"] for p in params if p["name"] == name)


def _state(c, mid):
    m = c.get(f"/v1/models/{mid}").json()
    return m["version"], m["n_records"], m["n_forgotten"], c.get("/v1/audit/checkpoint").json()["tree_size"]


def _refused(r, slug="validation-error"):
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == f"/problems/{slug}", r.text


SPEC = {"name": "m", "dim": 2, "bounds": {"x_norm": 1.0}}
FEATURES = {"type": "hashed", "dim": 2, "categorical": ["c"]}


@pytest.mark.parametrize("body, ok", [
    (SPEC, True),
    ({**SPEC, "dim": 2.0}, True),  # JSON Schema's integer: a number without a fractional part
    ({**SPEC, "loss": "softmax", "n_classes": 3.0}, True),
    ({**SPEC, "dim": 2.5}, False),
    ({**SPEC, "dim": True}, False),
    ({**SPEC, "n_classes": 3}, False),  # n_classes and classes go with softmax only
    ({**SPEC, "loss": "logistic", "classes": ["a", "b"]}, False),
    ({**SPEC, "n_classes": None, "classes": None}, True),  # null is absent
    ({**SPEC, "loss": "softmax"}, False),  # softmax needs one of them
    ({**SPEC, "loss": "softmax", "classes": ["a", "b", "c"]}, True),
    ({**SPEC, "loss": "softmax", "classes": ["a", "a"]}, False),  # distinct names
    ({**SPEC, "algorithm": "no_such_family"}, False),
    ({**SPEC, "features": FEATURES}, True),
    ({**SPEC, "features": {"type": "hashed", "dim": 2.0, "numeric": {"a": [0, 1]}}}, True),
    ({**SPEC, "features": {"type": "hashed", "dim": 2}}, False),  # at least one field
    ({**SPEC, "features": {"type": "hashed", "dim": 2, "numeric": {}, "categorical": []}}, False),
    ({**SPEC, "features": {**FEATURES, "categorical": ["c", "c"]}}, False),
])
def test_model_creation_rules(tenant, body, ok):
    _, c = tenant
    assert valid("ModelCreate", body) is ok
    r = c.post("/v1/models", json=body)
    if ok:
        assert r.status_code == 201, r.text
    else:
        assert r.status_code == 422, r.text
        assert c.get("/v1/models").json()["items"] == []


def test_the_document_lists_the_families():
    assert DOC["components"]["schemas"]["ModelCreate"]["properties"]["algorithm"]["enum"] == sorted(ALGORITHMS)


@pytest.fixture
def dense(tenant):
    _, c = tenant
    return c, learned_model(c, dim=2, n=4)


def test_x_and_features_are_exclusive(dense):
    c, mid = dense
    before = _state(c, mid)
    x = [0.1, 0.2]
    for ex in ({"id": "n", "y": 1}, {"id": "n", "x": x, "features": {"c": "a"}, "y": 1},
               {"id": "n", "x": None, "features": None, "y": 1}):
        assert not valid("Example", ex)
        _refused(c.post(f"/v1/models/{mid}/learn", json={"examples": [ex]}))
    for ex in ({"id": "n", "x": x, "y": 1}, {"id": "n", "x": x, "features": None, "y": 1}):
        assert valid("Example", ex)
    for body in ({}, {"x": [x], "features": [{"c": "a"}]}, {"x": None, "features": None}):
        assert not valid("PredictRequest", body)
        _refused(c.post(f"/v1/models/{mid}/predict", json=body))
    for body in ({"x": [x]}, {"x": [x], "features": None}):
        assert valid("PredictRequest", body)
        assert c.post(f"/v1/models/{mid}/predict", json=body).status_code == 200
    assert _state(c, mid) == before


def test_ids_are_unique(dense):
    c, mid = dense
    before = _state(c, mid)
    assert not valid("UnlearnRequest", {"ids": ["rec-0", "rec-0"]}) and valid("UnlearnRequest", {"ids": ["rec-0"]})
    _refused(c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0", "rec-0"]}))
    body = {"ids": ["n", "n"], "x": [[0.1, 0.1], [0.2, 0.2]], "y": [0, 1]}
    assert not valid("LearnColumnarRequest", body)
    _refused(c.post(f"/v1/models/{mid}/learn", json=body), "duplicate-record")
    assert _state(c, mid) == before


@pytest.mark.parametrize("key, ok", [("k", True), ("a key with spaces", True), ("~" * 255, True),
                                     ("k" * 256, False), ("tab\tinside", False), (b"caf\xe9", False)])
def test_idempotency_key_pattern(dense, key, ok):
    c, mid = dense
    text = key.decode("latin-1") if isinstance(key, bytes) else key
    assert Draft202012Validator(header_schema("/v1/models/{model_id}/unlearn")).is_valid(text) is ok
    before = _state(c, mid)
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]}, headers={"Idempotency-Key": key})
    if ok:
        assert r.status_code == 200, r.text
        again = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]}, headers={"Idempotency-Key": key})
        assert again.headers.get("idempotent-replayed") == "true" and again.json() == r.json()
    else:
        _refused(r)
        assert _state(c, mid) == before


def test_rules_in_words_have_their_problem_types(dense):
    """What the schema cannot say is in the operation's description, answered with its own problem type."""
    c, mid = dense
    before = _state(c, mid)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "s", "x": [0.1, 0.1], "y": "1"}]})
    _refused(r, "invalid-label")  # a class name for a model that declared none: the model's rule
    assert r.json()["errors"][0]["loc"] == ["body", "examples", 0, "y"]
    size = c.get("/v1/audit/checkpoint").json()["tree_size"]
    _refused(c.get("/v1/audit/consistency", params={"from_size": 2, "to_size": 1}))
    r = c.get("/v1/audit/consistency", params={"from_size": 1, "to_size": size + 1})
    _refused(r, "log-size-exceeded")
    assert r.json()["log_size"] == size
    _refused(c.get("/v1/audit/export"))
    _refused(c.get("/v1/audit/export", params={"record_id": "rec-1", "model_id": mid}))
    ops = DOC["paths"]
    assert "log-size-exceeded" in ops["/v1/audit/consistency"]["get"]["description"]
    assert "exactly one of `record_id` and `model_id`" in ops["/v1/audit/export"]["get"]["description"]
    assert "examples-not-accepted" in ops["/v1/models/{model_id}/unlearn"]["post"]["description"]
    assert _state(c, mid) == before


def test_a_data_keeping_model_takes_ids_only(tenant):
    _, c = tenant
    mid = create_model(c, dim=2, algorithm="retrain")["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(4, 2))}).status_code == 200
    before = _state(c, mid)
    body = {"ids": ["rec-0"], "examples": [{"id": "rec-0", "x": [0.1, 0.1], "y": 1}]}
    assert valid("UnlearnRequest", body)  # the model's rule, stated in the operation's description
    _refused(c.post(f"/v1/models/{mid}/unlearn", json=body), "examples-not-accepted")
    assert _state(c, mid) == before
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).status_code == 200
