"""Tenant isolation and authentication: every endpoint x every kind of wrong credential.

API.md: no or malformed credentials and revoked keys are 401; a key without the operation's scope, a tenant
key on admin endpoints and the admin token on tenant endpoints are 403; another tenant's ids are 404 (never
403, so ids cannot be probed).  None of these answers carries the victim tenant's data, and none changes it.
Every operation in the OpenAPI document must appear in the table below (so a new endpoint needs a row).
"""
from __future__ import annotations

import json
import time

import pytest

from app.openapi_dump import OUT

from .conftest import ADMIN_TOKEN
from .helpers import create_model, examples, unit_rows

PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/v1/keys"), ("GET", "/v1/algorithms"),
          ("GET", "/metrics")}
# (method, path template, body, scope): scope None = any tenant key, "admin" = the admin token.
# Rows for endpoints API.md announces but the app does not serve yet are skipped until it does.
ENDPOINTS = [
    ("POST", "/v1/models", {"name": "x", "dim": 2, "bounds": {"x_norm": 1.0}}, "write"),
    ("GET", "/v1/models", None, None),
    ("GET", "/v1/models/{model_id}", None, None),
    ("DELETE", "/v1/models/{model_id}", None, "write"),
    ("POST", "/v1/models/{model_id}/learn", {"examples": [{"id": "new-1", "x": [0.1, 0.1], "y": 1}]}, "write"),
    ("POST", "/v1/models/{model_id}/unlearn", {"ids": ["rec-1"]}, "write"),
    ("POST", "/v1/models/{model_id}/retrain", None, "write"),
    ("POST", "/v1/models/{model_id}/predict", {"x": [[0.1, 0.2]]}, "predict"),
    ("GET", "/v1/models/{model_id}/parameters", None, "predict"),
    ("POST", "/v1/models/{model_id}/evaluate", {"x": [[0.1, 0.2]], "y": [1]}, "predict"),
    ("GET", "/v1/models/{model_id}/evaluation", None, None),
    ("GET", "/v1/models/{model_id}/ledger", None, "audit"),
    ("GET", "/v1/models/{model_id}/deletions", None, "audit"),
    ("GET", "/v1/receipts/{receipt_id}", None, "audit"),
    ("GET", "/v1/audit/records/{record_id}", None, "audit"),
    ("GET", "/v1/audit/checkpoint", None, "audit"),
    ("GET", "/v1/audit/consistency?from_size=1&to_size=1", None, "audit"),
    ("GET", "/v1/audit/export?model_id={model_id}", None, "audit"),
    ("POST", "/v1/tenants", {"name": "intruder"}, "admin"),
    ("POST", "/v1/tenants/{tenant_id}/keys", {"scopes": ["write"]}, "admin"),
    ("DELETE", "/v1/tenants/{tenant_id}/keys/{key_id}", None, "admin"),
    ("GET", "/v1/tenant", None, None),
    ("GET", "/v1/tenants/{tenant_id}", None, "admin"),
    ("PUT", "/v1/tenants/{tenant_id}/quotas", {"models": 1000}, "admin"),
    ("DELETE", "/v1/tenants/{tenant_id}", None, "admin"),
    ("GET", "/v1/operations", None, None),
    ("GET", "/v1/operations/{operation_id}", None, None),
    ("GET", "/v1/operations/{operation_id}/receipts", None, "write|audit"),
    ("POST", "/v1/operations/{operation_id}/cancel", None, "write"),
]
OTHER_SCOPE = {"write": "predict", "predict": "audit", "audit": "write", "write|audit": "predict"}
MALFORMED = ["", "Bearer", "Bearer olu_ x", "Basic dXNlcjpwYXNz", "bearer olu_0000_nope", "Bearer olu_x", "Token abc",
             "Bearer " + "A" * 300, "Bearer olu__", f"Bearer {ADMIN_TOKEN}x"]


def _served() -> set[tuple[str, str]]:
    doc = json.loads(OUT.read_text())
    return {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}


@pytest.fixture(scope="module")
def world(server):
    """Tenant A (the victim) with a model, records and a receipt; tenant B (the attacker); A's keys."""
    a_id, a_key = server.new_tenant("victim")
    b_id, b_key = server.new_tenant("attacker")
    with server.client(a_key) as a:
        mid = create_model(a, dim=2, name="victim-secret-model-name")["id"]
        assert a.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 2))}).status_code == 200
        receipt = a.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).json()["receipts"][0]
        # an operation of the victim's (a forget run asynchronously), ended before the matrix runs
        r = a.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-5"]}, headers={"Prefer": "respond-async"})
        assert r.status_code == 202, r.text
        operation_id = r.json()["id"]
        deadline = time.monotonic() + 30
        while a.get(f"/v1/operations/{operation_id}").json()["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, "the victim's operation did not end"
            time.sleep(0.05)
        params = a.get(f"/v1/models/{mid}/parameters").json()
    with server.client(b_key) as b:
        create_model(b, dim=2, name="attacker-model")
    keys = {}
    with server.admin() as adm:
        for scope in ("write", "predict", "audit"):
            keys[scope] = adm.post(f"/v1/tenants/{a_id}/keys", json={"scopes": [scope]}).json()
        revoked = adm.post(f"/v1/tenants/{a_id}/keys", json={"scopes": ["write", "predict", "audit"]}).json()
        assert adm.delete(f"/v1/tenants/{a_id}/keys/{revoked['id']}").status_code == 204
        spare = adm.post(f"/v1/tenants/{a_id}/keys", json={"scopes": ["audit"]}).json()
    ids = {"model_id": mid, "receipt_id": receipt["id"], "record_id": "rec-1", "tenant_id": a_id,
           "key_id": spare["id"], "operation_id": operation_id}
    secrets_of_a = [receipt["record_commitment"], receipt["signature"], "victim-secret-model-name",
                    json.dumps(params["weights"][0]), a_key, keys["write"]["api_key"]]
    return {"a_key": a_key, "b_key": b_key, "keys": keys, "revoked": revoked["api_key"], "ids": ids,
            "secrets": secrets_of_a, "a_id": a_id}


def _rows():
    served = _served()
    for method, template, body, scope in ENDPOINTS:
        if (method, template.split("?")[0]) in served:
            yield method, template, body, scope


def test_every_served_operation_has_a_row():
    rows = {(m, t.split("?")[0]) for m, t, _, _ in ENDPOINTS}
    missing = _served() - rows - PUBLIC
    assert not missing, f"add these operations to the isolation matrix: {sorted(missing)}"


def _call(server, method, path, body, auth: str | None):
    headers = {} if auth is None else {"authorization": auth}
    with server.client() as c:
        return c.request(method, path, json=body, headers=headers)


def _snapshot(server, world):
    with server.client(world["a_key"]) as a:
        mid = world["ids"]["model_id"]
        m = a.get(f"/v1/models/{mid}").json()
        return (m["version"], m["step"], m["n_forgotten"], m["status"], len(a.get("/v1/models").json()["items"]),
                len(a.get(f"/v1/models/{mid}/deletions").json()["items"]))


def _assert_problem(r, status, world, what):
    assert r.status_code == status, f"{what}: {r.status_code} {r.text[:300]}"
    assert r.headers["content-type"].startswith("application/problem+json"), what
    for secret in world["secrets"]:
        assert secret not in r.text, f"{what} leaked victim data"


def test_isolation_matrix(server, world):
    before = _snapshot(server, world)
    checked = 0
    for method, template, body, scope in _rows():
        path = template.format(**world["ids"])
        what = f"{method} {template}"
        # no credentials, malformed credentials, revoked key: 401
        _assert_problem(_call(server, method, path, body, None), 401, world, what + " without key")
        for bad in MALFORMED:
            _assert_problem(_call(server, method, path, body, bad), 401, world, f"{what} with {bad[:20]!r}")
        _assert_problem(_call(server, method, path, body, f"Bearer {world['revoked']}"), 401, world,
                        what + " with revoked key")
        if scope == "admin":
            for key in (world["a_key"], world["b_key"]):  # tenant keys never administer
                _assert_problem(_call(server, method, path, body, f"Bearer {key}"), 403, world, what + " tenant key")
            checked += 1
            continue
        # the admin token manages tenants and keys only
        _assert_problem(_call(server, method, path, body, f"Bearer {ADMIN_TOKEN}"), 403, world, what + " admin")
        # a key of the right tenant without the scope
        if scope is not None:
            wrong = world["keys"][OTHER_SCOPE[scope]]["api_key"]
            _assert_problem(_call(server, method, path, body, f"Bearer {wrong}"), 403, world, what + " wrong scope")
        # another tenant's key with every scope: the victim's ids do not exist for it
        r = _call(server, method, path, body, f"Bearer {world['b_key']}")
        if "{" in template:
            _assert_problem(r, 404, world, what + " other tenant")
        else:  # collection endpoints answer for the caller's own tenant, never with the victim's data
            assert r.status_code < 500, what
            for secret in world["secrets"]:
                assert secret not in r.text, f"{what} as other tenant leaked victim data"
        checked += 1
    assert checked >= 15
    assert _snapshot(server, world) == before


def test_other_tenant_cannot_reach_victim_objects_by_any_route(server, world):
    """Explicit cross-tenant writes: all 404, the victim's model is untouched."""
    before = _snapshot(server, world)
    mid = world["ids"]["model_id"]
    with server.client(world["b_key"]) as b:
        assert b.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-2"]}).status_code == 404
        assert b.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "evil", "x": [0.1, 0.1], "y": 1}]}).status_code == 404
        assert b.delete(f"/v1/models/{mid}").status_code == 404
        assert b.get("/v1/audit/records/rec-1").status_code == 404  # same client id, other tenant: unknown
        listed = b.get("/v1/models").json()["items"]
        assert "attacker-model" in [m["name"] for m in listed]
        assert all(m["id"] != mid and m["name"] != "victim-secret-model-name" for m in listed)
    assert _snapshot(server, world) == before
    with server.client(world["a_key"]) as a:  # the victim still sees its record as learned
        st = a.get("/v1/audit/records/rec-2").json()
        assert st["models"][0]["status"] == "learned"
