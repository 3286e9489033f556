"""Feature dictionaries over HTTP (issue 16, item 2): models declared with a hashed feature spec learn, forget and
predict from dictionaries exactly as a dense model does from the encoded vectors; bad input is a 422 problem naming
the field and changes nothing; the spec is validated at creation."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest

from app.features import featurize, normalize_spec

from .helpers import create_model

DIM = 16
FEATURES = {"type": "hashed", "dim": DIM, "numeric": {"age": [0, 120], "income": [0, 200000]},
            "categorical": ["country", "tags"]}


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    countries = ["FR", "DE", "IT", "ES", "PL"]
    tags = ["a", "b", "c", "d", "e", "f"]
    out = []
    for i in range(n):
        row = {"age": int(rng.integers(18, 90)), "country": countries[int(rng.integers(0, 5))],
               "tags": sorted(set(rng.choice(tags, size=int(rng.integers(0, 4))).tolist()))}
        if i % 3:
            row["income"] = float(rng.uniform(0, 200000))
        out.append(row)
    return out


def _labels(rows: list[dict]) -> list[float]:
    return [1.0 if r["country"] in ("FR", "IT") or r["age"] > 60 else 0.0 for r in rows]


def _hashed(c, **overrides) -> dict:
    body = {"dim": DIM, "bounds": {"x_norm": 2.0}, "features": FEATURES}
    body.update(overrides)
    return create_model(c, **body)


def _problem(r, status: int, slug: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"].endswith("/" + slug), body
    return body


def _state(c, mid: str) -> tuple:
    m = c.get(f"/v1/models/{mid}").json()
    return m["version"], m["step"], m["n_records"], m["n_forgotten"], c.get(f"/v1/models/{mid}/parameters").json()


def test_model_serves_its_normalised_feature_spec(tenant):
    _, c = tenant
    m = _hashed(c)
    f = m["features"]
    assert f["type"] == "hashed" and f["dim"] == DIM and f["hash"] == "murmurhash3_x64_128"
    assert f["numeric"] == {"age": [0.0, 120.0], "income": [0.0, 200000.0]}
    assert f["categorical"] == ["country", "tags"]
    assert f["out_of_range"] == "refuse" and f["unknown_fields"] == "refuse"
    assert create_model(c, dim=3)["features"] is None  # dense models as before


@pytest.mark.parametrize("algorithm,hp", [("passive_olu", {}), ("retrain", {}),
                                          ("memory_pair", {"deletion_features": "client"}), ("exact_ridge", {})])
def test_dictionaries_learn_forget_predict_as_their_dense_encoding(tenant, algorithm, hp):
    """Dictionaries are learned, forgotten (by id, or with the dictionaries sent back for a model that keeps no
    data, matched against what was learned whatever the key order) and predicted; a prediction on a dictionary is
    the published parameters applied to the featurizer's encoding, which respects the declared bound."""
    _, c = tenant
    m = _hashed(c, algorithm=algorithm, hyperparameters=hp, **({"loss": "squared"} if algorithm == "exact_ridge" else {}))
    mid = m["id"]
    rows = _rows(30)
    y = _labels(rows)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": [
        {"id": f"u{i}", "features": row, "y": v} for i, (row, v) in enumerate(zip(rows, y))]})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 30
    # predictions on dictionaries are the published parameters applied to the encodings (x_norm = 2)
    spec = normalize_spec(FEATURES, DIM)
    X = np.array([featurize(spec, row, 2.0) for row in rows])
    assert np.all(np.linalg.norm(X, axis=1) <= 2.0 + 1e-12)
    p = c.post(f"/v1/models/{mid}/predict", json={"features": rows[:5]})
    assert p.status_code == 200, p.text
    params = c.get(f"/v1/models/{mid}/parameters").json()
    scores = X[:5] @ np.array(params["weights"]) + params["bias"]
    got = p.json()
    assert got["version"] == params["version"]
    expected = (scores > 0).astype(float) if m["loss"] == "logistic" else scores
    assert np.allclose(got["predictions"], expected)
    # forget: data-keeping families by id; the client-feature memory pair needs the dictionaries back
    body: dict = {"ids": ["u3", "u7"]}
    if m["hyperparameters"].get("deletion_features") == "client":  # memory_pair's option, exact_ridge's default
        missing = c.post(f"/v1/models/{mid}/unlearn", json=body)
        _problem(missing, 422, "deletion-features-required")
        # a changed dictionary is not the one learned
        wrong = dict(rows[3], age=rows[3]["age"] + 1)
        bad = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["u3"], "examples": [
            {"id": "u3", "features": wrong, "y": y[3]}]})
        _problem(bad, 422, "example-mismatch")
        # the same dictionary with its keys in another order is the same example
        body["examples"] = [{"id": f"u{i}", "features": dict(reversed(list(rows[i].items()))), "y": y[i]}
                            for i in (7, 3)]
    r = c.post(f"/v1/models/{mid}/unlearn", json=body)
    assert r.status_code == 200, r.text
    assert len(r.json()["receipts"]) == 2
    assert c.get(f"/v1/models/{mid}").json()["n_forgotten"] == 2


def test_dense_and_dictionary_shapes_are_refused_on_the_wrong_model(tenant):
    _, c = tenant
    hashed = _hashed(c)["id"]
    dense = create_model(c, dim=DIM)["id"]
    before = _state(c, hashed), _state(c, dense)
    x = [0.0] * DIM
    body = _problem(c.post(f"/v1/models/{hashed}/learn", json={"examples": [{"id": "a", "x": x, "y": 1}]}),
                    422, "features-required")
    assert body["index"] == 0 and body["errors"][0]["loc"] == ["body", "examples", 0, "x"]
    _problem(c.post(f"/v1/models/{hashed}/learn", json={"ids": ["a"], "x": [x], "y": [1]}), 422, "features-required")
    _problem(c.post(f"/v1/models/{hashed}/learn", content=msgpack.packb({"ids": ["a"], "x": [x], "y": [1]}),
                    headers={"content-type": "application/msgpack"}), 422, "features-required")
    body = _problem(c.post(f"/v1/models/{hashed}/predict", json={"x": [x]}), 422, "features-required")
    assert body["errors"][0]["loc"] == ["body", "x", 0]
    body = _problem(c.post(f"/v1/models/{dense}/learn", json={"examples": [
        {"id": "a", "x": x, "y": 1}, {"id": "b", "features": {"age": 3}, "y": 0}]}), 422, "features-not-declared")
    assert body["index"] == 1
    body = _problem(c.post(f"/v1/models/{dense}/predict", json={"features": [{"age": 3}]}), 422,
                    "features-not-declared")
    assert body["errors"][0]["loc"] == ["body", "features", 0]
    # neither or both shapes in one example: schema validation
    _problem(c.post(f"/v1/models/{hashed}/learn", json={"examples": [{"id": "a", "y": 1}]}), 422, "validation-error")
    _problem(c.post(f"/v1/models/{hashed}/learn", json={"examples": [
        {"id": "a", "x": x, "features": {"age": 3}, "y": 1}]}), 422, "validation-error")
    _problem(c.post(f"/v1/models/{hashed}/predict", json={}), 422, "validation-error")
    assert (_state(c, hashed), _state(c, dense)) == before


BAD_DICTS = [
    ("unknown field", {"age": 30, "colour": "vermilion-q7"}, "unknown-feature", "colour"),
    ("numeric out of range", {"age": 121}, "out-of-range-feature", "age"),
    ("numeric below range", {"age": -1}, "out-of-range-feature", "age"),
    ("string in numeric field", {"age": "31"}, "invalid-features", "age"),
    ("number in categorical field", {"country": 33}, "invalid-features", "country"),
    ("list of numbers in categorical", {"tags": [1, 2]}, "validation-error", None),
    ("boolean value", {"age": True}, "validation-error", None),
    ("nested object", {"country": {"code": "FRxq"}}, "validation-error", None),
    ("numeric list", {"age": ["31"]}, "invalid-features", "age"),
]


@pytest.mark.parametrize("label,row,slug,field", BAD_DICTS, ids=[b[0] for b in BAD_DICTS])
def test_bad_dictionaries_are_422_naming_the_field_and_change_nothing(tenant, label, row, slug, field):
    _, c = tenant
    mid = _hashed(c)["id"]
    ok = {"age": 40, "country": "FR"}
    c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "first", "features": ok, "y": 1}]})
    before = _state(c, mid)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": [
        {"id": "ok", "features": ok, "y": 1}, {"id": "bad", "features": row, "y": 0}]})
    body = _problem(r, 422, slug)
    if field is not None:
        assert body["field"] == field and field in body["detail"]
        assert body["index"] == 1 and body["errors"][0]["loc"] == ["body", "examples", 1, "features", field]
        # the refused value itself is never echoed
        for v in row.values():
            if isinstance(v, str) and len(v) > 2:
                assert v not in r.text
    p = _problem(c.post(f"/v1/models/{mid}/predict", json={"features": [ok, row]}), 422, slug)
    if field is not None:
        assert p["index"] == 1 and p["errors"][0]["loc"] == ["body", "features", 1, field]
    assert _state(c, mid) == before
    # unlearn: first is learned; with a bad dictionary nothing is forgotten
    m2 = _hashed(c, algorithm="memory_pair", hyperparameters={"deletion_features": "client"})["id"]
    c.post(f"/v1/models/{m2}/learn", json={"examples": [{"id": "first", "features": ok, "y": 1}]})
    before2 = _state(c, m2)
    _problem(c.post(f"/v1/models/{m2}/unlearn", json={"ids": ["first"], "examples": [
        {"id": "first", "features": row, "y": 1}]}), 422, slug)
    assert _state(c, m2) == before2


def test_clip_and_ignore_policies(tenant):
    _, c = tenant
    spec = {**FEATURES, "out_of_range": "clip", "unknown_fields": "ignore"}
    mid = _hashed(c, features=spec)["id"]
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": [
        {"id": "a", "features": {"age": 500, "colour": "red", "country": "FR"}, "y": 1}]})
    assert r.status_code == 200, r.text
    p1 = c.post(f"/v1/models/{mid}/predict", json={"features": [{"age": 500, "colour": "red", "country": "FR"},
                                                               {"age": 120, "country": "FR"}]}).json()
    assert p1["scores"][0] == p1["scores"][1]  # clipped to 120, colour ignored


BAD_SPECS = [
    ("dim differs from the model's", {"dim": DIM + 1}, "features.dim"),
    ("empty range", {"numeric": {"age": [5, 5]}}, "features.numeric.age"),
    ("reversed range", {"numeric": {"age": [10, 0]}}, "features.numeric.age"),
    ("overflowing range", {"numeric": {"age": [-1.7e308, 1.7e308]}}, "features.numeric.age"),
    ("field both numeric and categorical", {"categorical": ["age"]}, "features.categorical"),
    ("duplicate categorical", {"categorical": ["a", "a"]}, "features.categorical"),
    ("no field at all", {"numeric": {}, "categorical": []}, "features.numeric"),
]


@pytest.mark.parametrize("label,change,field", BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_feature_spec_is_validated_at_creation(tenant, label, change, field):
    _, c = tenant
    n = len(c.get("/v1/models").json()["items"])
    body = {"name": "m", "dim": DIM, "bounds": {"x_norm": 1.0}, "features": {**FEATURES, **change}}
    r = c.post("/v1/models", json=body)
    problem = _problem(r, 422, "invalid-model-spec")
    assert problem["errors"][0]["field"] == field
    assert len(c.get("/v1/models").json()["items"]) == n


@pytest.mark.parametrize("change", [{"dim": 0}, {"type": "dense"}, {"numeric": {"age": [0]}},
                                    {"numeric": {"age": [0, float("inf")]}}, {"out_of_range": "wrap"},
                                    {"unknown_fields": "keep"}, {"seed": 3}, {"categorical": ["bad\nname"]}])
def test_feature_spec_schema_refusals(tenant, change):
    _, c = tenant
    body = {"name": "m", "dim": DIM, "bounds": {"x_norm": 1.0}, "features": {**FEATURES, **change}}
    import json as _json
    r = c.post("/v1/models", content=_json.dumps(body), headers={"content-type": "application/json"})
    _problem(r, 422, "validation-error")


def test_openapi_describes_msgpack_outside_the_generated_content():
    """The learn body's msgpack form is documented by the x-msgpack extension (not a content entry the SDK
    generator would drop with a warning); columnar msgpack bodies still learn (tests/test_api_learn_columnar.py)."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "openapi" / "openapi.json").read_text())
    body = doc["paths"]["/v1/models/{model_id}/learn"]["post"]["requestBody"]
    assert list(body["content"]) == ["application/json"]
    assert "application/msgpack" in body["x-msgpack"]["mediaTypes"]
    assert body["x-msgpack"]["schema"] == {"$ref": "#/components/schemas/LearnColumnarRequest"}
    assert "FeatureDict" in doc["components"]["schemas"] and "FeatureSpec" in doc["components"]["schemas"]
