"""The hot routes answer pre-serialised JSON: it must be exactly the response model's serialisation (what FastAPI
sent before), and an idempotent replay must be byte-for-byte the first answer."""
from __future__ import annotations

from app.schemas import LearnResponse, Model, PredictResponse, UnlearnResponse

from .helpers import create_model, examples, unit_rows


def _is_model_json(r, model) -> None:
    assert r.headers["content-type"] == "application/json"
    assert r.content == model.model_validate_json(r.content).model_dump_json().encode()


def test_bodies_are_the_response_models(tenant):
    _, c = tenant
    mid = create_model(c, dim=3)["id"]
    X = unit_rows(4, 3)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)})
    assert r.status_code == 200
    _is_model_json(r, LearnResponse)
    r = c.post(f"/v1/models/{mid}/predict", json={"x": X[:2].tolist()})
    assert r.status_code == 200
    _is_model_json(r, PredictResponse)
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]})
    assert r.status_code == 200
    _is_model_json(r, UnlearnResponse)
    assert r.json()["receipts"][0]["proof"] is None  # optional fields are present, as before


def test_replays_are_the_same_bytes(tenant):
    _, c = tenant
    body = {"name": "replay", "dim": 2, "bounds": {"x_norm": 1.0}}
    first = c.post("/v1/models", json=body, headers={"Idempotency-Key": "m"})
    again = c.post("/v1/models", json=body, headers={"Idempotency-Key": "m"})
    assert first.status_code == again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert first.content == again.content
    _is_model_json(first, Model)
    mid = first.json()["id"]
    batch = {"examples": examples(unit_rows(5, 2))}
    for path, payload in (("learn", batch), ("unlearn", {"ids": ["rec-0", "rec-3"]})):
        first = c.post(f"/v1/models/{mid}/{path}", json=payload, headers={"Idempotency-Key": path})
        again = c.post(f"/v1/models/{mid}/{path}", json=payload, headers={"Idempotency-Key": path})
        assert first.status_code == again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert "idempotent-replayed" not in first.headers
        assert first.content == again.content
