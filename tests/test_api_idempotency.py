"""Idempotency-Key: a retry returns the first answer and changes nothing."""
from __future__ import annotations

from .helpers import create_model, examples, unit_rows


def test_retried_unlearn_spends_budget_once(tenant):
    _, c = tenant
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 2))})
    h = {"Idempotency-Key": "forget-rec-1"}
    first = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]}, headers=h)
    assert first.status_code == 200
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    again = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]}, headers=h)
    assert again.status_code == 200 and again.headers.get("idempotent-replayed") == "true"
    assert again.json() == first.json()
    assert c.get(f"/v1/models/{mid}/ledger").json() == ledger
    assert len(c.get(f"/v1/models/{mid}/deletions").json()["items"]) == 1
    # same key, different body
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-2"]}, headers=h)
    assert r.status_code == 422 and r.json()["type"].endswith("/idempotency-key-reused")
    assert c.get(f"/v1/models/{mid}/ledger").json() == ledger


def test_retried_learn_and_create(tenant):
    _, c = tenant
    body = {"name": "idem", "dim": 2, "bounds": {"x_norm": 1.0}}
    m1 = c.post("/v1/models", json=body, headers={"Idempotency-Key": "mk"})
    m2 = c.post("/v1/models", json=body, headers={"Idempotency-Key": "mk"})
    assert m1.status_code == m2.status_code == 201 and m1.json()["id"] == m2.json()["id"]
    assert len(c.get("/v1/models").json()["items"]) == 1
    mid = m1.json()["id"]
    batch = {"examples": examples(unit_rows(3, 2))}
    a = c.post(f"/v1/models/{mid}/learn", json=batch, headers={"Idempotency-Key": "b1"})
    b = c.post(f"/v1/models/{mid}/learn", json=batch, headers={"Idempotency-Key": "b1"})
    assert a.status_code == b.status_code == 200 and a.json() == b.json()
    assert c.get(f"/v1/models/{mid}").json()["step"] == 3
    # without a key the retry is a duplicate
    assert c.post(f"/v1/models/{mid}/learn", json=batch).status_code == 409


def test_concurrent_duplicate_is_409_and_failed_request_releases_the_key(server, tenant):
    tenant_id, c = tenant
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(3, 2))})
    from app.services.idempotency import IdempotencyGuard, fingerprint

    store = server.app.state.ctx.idempotency
    claim = store.begin(tenant_id, "busy", fingerprint("POST", f"/v1/models/{mid}/unlearn", b"x"))
    assert isinstance(claim, IdempotencyGuard)  # a request "in flight" with this key
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}, headers={"Idempotency-Key": "busy"})
    assert r.status_code in (409, 422)  # in flight (409) if the fingerprint matches, reused (422) otherwise
    claim.release()
    # a request that fails does not burn its key
    bad = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["nope"]}, headers={"Idempotency-Key": "k2"})
    assert bad.status_code == 404
    ok = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["nope"]}, headers={"Idempotency-Key": "k2"})
    assert ok.status_code == 404  # re-executed, not replayed


def test_in_flight_same_request_is_409(server, tenant):
    tenant_id, c = tenant
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(3, 2))})
    from app.api.idempotent import request_fingerprint
    from app.schemas import UnlearnRequest

    claim = server.app.state.ctx.idempotency.begin(tenant_id, "same", request_fingerprint(
        "POST", f"/v1/models/{mid}/unlearn", UnlearnRequest(ids=["rec-0"])))
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}, headers={"Idempotency-Key": "same"})
    assert r.status_code == 409 and r.json()["type"].endswith("/idempotency-request-in-progress")
    claim.release()
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]},
                  headers={"Idempotency-Key": "same"}).status_code == 200
