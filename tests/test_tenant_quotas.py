"""Per-tenant quotas of live models, records held and bytes stored (issue 29, finding 3), on SQLite and, when
OLU_TEST_POSTGRES_URL is set, PostgreSQL.

A creation or learn past a quota is refused 409 quota-exceeded (naming quota, limit, usage) and changes nothing;
usage is reported on the tenant (GET /v1/tenant, GET /v1/tenants/{id}) and falls when records are forgotten or
models deleted, giving the quota back; the admin sets each tenant's quotas."""
from __future__ import annotations

import threading

from tests.helpers import create_model, examples, unit_rows


def _set(server, tenant_id: str, **quotas) -> dict:
    with server.admin() as a:
        r = a.put(f"/v1/tenants/{tenant_id}/quotas", json=quotas)
    assert r.status_code == 200, r.text
    return r.json()


def _usage(c) -> dict:
    r = c.get("/v1/tenant")
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def _refused(r, quota: str, limit: int, usage: int) -> None:
    assert r.status_code == 409, r.text
    body = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert body["type"].endswith("/quota-exceeded")
    assert (body["quota"], body["limit"], body["usage"]) == (quota, limit, usage), body


def test_models_quota_refuses_and_deleting_gives_it_back(server, tenant):
    tenant_id, c = tenant
    view = _set(server, tenant_id, models=2)
    assert view["quotas"]["models"] == 2 and view["quota_overrides"]["models"] == 2
    assert view["quota_overrides"]["records"] is None and view["quotas"]["records"] is not None  # the default
    first = create_model(c)["id"]
    create_model(c)
    _refused(c.post("/v1/models", json={"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 4,
                                       "bounds": {"x_norm": 1.0}, "domain_radius": 10.0, "l2": 0.05,
                                       "privacy": {"epsilon": 1.0, "delta": 1e-6}}), "models", 2, 2)
    assert len(c.get("/v1/models").json()["items"]) == 2  # nothing was created
    assert _usage(c)["models"] == 2
    assert c.delete(f"/v1/models/{first}").status_code == 204
    assert _usage(c)["models"] == 1
    create_model(c)
    _set(server, tenant_id, models=0)  # 0: no limit
    create_model(c)
    assert _usage(c)["models"] == 3


def test_records_quota_refuses_whole_learn_and_forgetting_gives_it_back(server, tenant):
    tenant_id, c = tenant
    _set(server, tenant_id, records=10)
    mid = create_model(c)["id"]
    other = create_model(c)["id"]
    X = unit_rows(20, 4, seed=1)
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[:8])}).status_code == 200
    before = c.get(f"/v1/models/{mid}").json()
    usage = _usage(c)
    assert usage["records"] == 8 and usage["bytes"] > 0
    # 8 + 5 > 10, in this model or another: refused whole, nothing changes
    for m in (mid, other):
        r = c.post(f"/v1/models/{m}/learn", json={"examples": examples(X[8:13], start=8)})
        _refused(r, "records", 10, 8)
        assert r.json()["requested"] == 5
    after = c.get(f"/v1/models/{mid}").json()
    assert (after["version"], after["n_records"], after["step"]) == (before["version"], before["n_records"], before["step"])
    assert _usage(c) == usage
    # forgetting 3 gives them back: the same 5 ids (never recorded) are now accepted
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0", "rec-1", "rec-2"]})
    assert r.status_code == 200, r.text
    assert _usage(c)["records"] == 5
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[8:13], start=8)}).status_code == 200
    assert _usage(c)["records"] == 10
    _refused(c.post(f"/v1/models/{other}/learn", json={"examples": examples(X[13:14], start=13)}), "records", 10, 10)
    # deleting a model gives its records back
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    assert _usage(c)["records"] == 0
    assert c.post(f"/v1/models/{other}/learn", json={"examples": examples(X[13:14], start=13)}).status_code == 200


def test_bytes_quota_counts_retained_examples_and_falls_after_forget(server, tenant):
    tenant_id, c = tenant
    dim = 50
    mid = create_model(c, dim=dim, algorithm="retrain")["id"]
    empty = _usage(c)["bytes"]
    X = unit_rows(40, dim, seed=2)
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[:10])}).status_code == 200
    ten = _usage(c)["bytes"]
    per_record = (ten - empty) / 10
    assert per_record >= 8 * (dim + 1) + 28  # the sealed example at least
    _set(server, tenant_id, bytes=ten + int(5.5 * per_record))
    limit = ten + int(5.5 * per_record)
    before = c.get(f"/v1/models/{mid}").json()
    _refused(c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[10:16], start=10)}), "bytes", limit, ten)
    assert c.get(f"/v1/models/{mid}").json()["version"] == before["version"]
    assert _usage(c)["bytes"] == ten
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[10:15], start=10)}).status_code == 200
    fifteen = _usage(c)["bytes"]
    assert fifteen > ten
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"rec-{i}" for i in range(5)]})
    assert r.status_code == 200, r.text
    assert _usage(c)["bytes"] < fifteen
    with server.admin() as a:  # the admin's view says the same
        view = a.get(f"/v1/tenants/{tenant_id}").json()
    assert view["usage"] == _usage(c) and view["quotas"]["bytes"] == limit and view["id"] == tenant_id


def test_concurrent_learns_do_not_pass_a_quota_together(server, tenant):
    """Learns on several models of one tenant at once: together they never hold more than the quota."""
    tenant_id, c = tenant
    _set(server, tenant_id, records=25)
    mids = [create_model(c)["id"] for _ in range(4)]
    X = unit_rows(10, 4, seed=3)
    codes: list[int] = []

    def go(mid: str) -> None:
        with server.client(c.headers["authorization"].split()[1]) as cc:
            codes.append(cc.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)}).status_code)

    threads = [threading.Thread(target=go, args=(m,)) for m in mids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200, 200, 409, 409], codes
    assert _usage(c)["records"] == 20


def test_quotas_are_admin_only_and_validated(server, tenant):
    tenant_id, c = tenant
    assert c.put(f"/v1/tenants/{tenant_id}/quotas", json={"models": 1}).status_code == 403
    assert c.get(f"/v1/tenants/{tenant_id}").status_code == 403
    with server.admin() as a:
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"models": -1}).status_code == 422
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"disk": 1}).status_code == 422
        # the bound is exact as a double, so a client that validates in doubles agrees with the service at the edge
        # (it was 2**62: 2**62 + 95 read as 2**62 in doubles, schema-valid to schemathesis, refused here)
        top = 2**53 - 1
        maximum = a.get("/openapi.json").json()["components"]["schemas"]["QuotaSet"]["properties"]["records"]
        assert [b.get("maximum") for b in maximum["anyOf"] if b.get("type") == "integer"] == [top]
        assert float(top) == top
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"records": top}).status_code == 200
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"bytes": True}).status_code == 422  # not read as 1
        for too_big in (top + 1, 2**62 + 95):
            r = a.put(f"/v1/tenants/{tenant_id}/quotas", json={"records": too_big})
            assert r.status_code == 422 and "records" in r.text, r.text
        assert a.put("/v1/tenants/ten_nope/quotas", json={}).status_code == 404
        assert a.get("/v1/tenants/ten_nope").status_code == 404
        view = a.put(f"/v1/tenants/{tenant_id}/quotas", json={}).json()  # back to the defaults
    assert view["quota_overrides"] == {"models": None, "records": None, "bytes": None, "audit_bytes": None}
    assert view["quotas"] == {"models": 100, "records": 10_000_000, "bytes": 1 << 30, "audit_bytes": 4 << 30}
