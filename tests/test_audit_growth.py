"""Audit growth bounded without refusing a forget (issue 37, F5-A), and the quotas' one spelling (item 8).

What a tenant's forgets, deletions and checkpoints leave for audit (receipts, Merkle nodes, forgotten and erased
records' commitments, ledger entries, deleted models' rows) is counted against the quota ``audit_bytes``; once it
is spent, learns and creations are refused (409 quota-exceeded naming the quota) and forgets still answer 200.  A
churn of learn -> forget -> create -> delete under small quotas (the finding: 41 MB in 63 s under quotas of 2
models, 1 000 records and 2 MB) stops growing the database."""
from __future__ import annotations

from sqlalchemy import func, select

from app.db.tables import Checkpoint, LedgerEntry, MerkleNode, Model, Receipt, Record

from .helpers import create_model, examples, unit_rows


def _footprint(server, tenant_id: str) -> dict:
    """Rows (and bytes of the variable-length values) the tenant has in the tables that keep the audit trail."""
    with server.app.state.ctx.db.read() as s:
        def n(q):
            return int(s.execute(q).scalar_one() or 0)

        models = select(Model.id).where(Model.tenant_id == tenant_id).scalar_subquery()
        out = {"receipts": n(select(func.count()).where(Receipt.tenant_id == tenant_id)),
               "receipt_bytes": n(select(func.sum(func.length(Receipt.body))).where(Receipt.tenant_id == tenant_id)),
               "nodes": n(select(func.count()).where(MerkleNode.tenant_id == tenant_id)),
               "records": n(select(func.count()).where(Record.tenant_id == tenant_id)),
               "checkpoints": n(select(func.count()).where(Checkpoint.tenant_id == tenant_id)),
               "ledger": n(select(func.count()).where(LedgerEntry.model_id.in_(models))),
               "models": n(select(func.count()).where(Model.tenant_id == tenant_id))}
        if server.backend == "sqlite":
            out["pages"] = int(s.connection().exec_driver_sql("PRAGMA page_count").scalar())
    return out


def test_churn_stops_growing_once_the_audit_allowance_is_spent_and_every_forget_answers(server):
    tenant_id, key = server.new_tenant("churn")
    with server.admin() as a:
        r = a.put(f"/v1/tenants/{tenant_id}/quotas",
                  json={"models": 2, "records": 1000, "bytes": 2_000_000, "audit_bytes": 150_000})
        assert r.status_code == 200, r.text
    X = unit_rows(40, 4, seed=3)
    with server.client(key) as c:
        mid = create_model(c)["id"]
        refused, forgets, history, i = [], 0, [], 0
        while len(history) < 40:
            r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X, prefix=f"r{i}")})
            if r.status_code == 200:
                for part in range(0, 40, 20):  # every forget answers, before and after the allowance is spent
                    f = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"r{i}-{j}" for j in range(part, part + 20)]})
                    assert f.status_code == 200, f.text
                    forgets += 20
            else:
                assert r.status_code == 409, r.text
                body = r.json()
                assert (body["type"].endswith("/quota-exceeded"), body["quota"], body["limit"]) == (
                    True, "audit_bytes", 150_000), body
                assert body["usage"] >= 150_000 and "forget" in body["detail"] and "raising" in body["detail"]
                refused.append(i)
            created = c.post("/v1/models", json={"name": "m", "algorithm": "passive_olu", "loss": "logistic",
                                                 "dim": 4, "bounds": {"x_norm": 1.0}, "domain_radius": 10.0,
                                                 "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}})
            if created.status_code == 201:
                assert c.delete(f"/v1/models/{mid}").status_code == 204
                mid = created.json()["id"]
            else:
                assert created.status_code == 409 and created.json()["quota"] == "audit_bytes", created.text
            c.get("/v1/audit/checkpoint")  # an auditor reads along: checkpoints count too
            history.append(_footprint(server, tenant_id))
            i += 1
            if len(refused) >= 5:
                break
        assert refused, "the audit allowance never refused a learn"
        assert forgets > 0
        # the database stopped growing: the iterations after the first refusal write nothing
        assert history[-1] == history[-2] == history[refused[0]], (history[refused[0] - 1:], refused)
        usage = c.get("/v1/tenant").json()["usage"]
        assert usage["audit_bytes"] >= 150_000
        # the estimate follows what is stored: more than the receipts' bytes, within a few times them
        last = history[-1]
        assert last["receipt_bytes"] < usage["audit_bytes"] < 4 * last["receipt_bytes"] + 400 * last["nodes"], usage
        # the model still answers predictions; its records can still be forgotten: a forget is never refused
        assert c.post(f"/v1/models/{mid}/predict", json={"x": [[0.1, 0.2, 0.0, 0.0]]}).status_code == 200


def test_audit_usage_is_shown_and_one_spelling_for_no_limit(server, tenant):
    tenant_id, c = tenant
    with server.admin() as a:
        view = a.put(f"/v1/tenants/{tenant_id}/quotas", json={"records": 0, "audit_bytes": 0}).json()
    # 0 is "no limit" in both the quotas in force and the tenant's own settings; null only means "the default"
    assert view["quotas"]["records"] == 0 and view["quota_overrides"]["records"] == 0
    assert view["quotas"]["audit_bytes"] == 0 and view["quota_overrides"]["audit_bytes"] == 0
    assert view["quota_overrides"]["models"] is None and view["quotas"]["models"] == 100
    mid = create_model(c)["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 4))}).status_code == 200
    assert c.get("/v1/tenant").json()["usage"]["audit_bytes"] == 0  # learning leaves nothing for audit
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).status_code == 200
    one = c.get("/v1/tenant").json()["usage"]["audit_bytes"]
    assert one > 1000  # a receipt, its nodes, the record's row and its ledger entry
    assert c.delete(f"/v1/models/{mid}").status_code == 204  # erasing 5 held records: 5 rows + receipt + model row
    assert c.get("/v1/tenant").json()["usage"]["audit_bytes"] > one + 5 * 200


def test_records_a_restart_dropped_are_no_longer_held(server, tenant):
    """Issue 37 item 8: an exact restart of a model that keeps no data discards everything it learned before; those
    records were still counted as held (records quota).  They stay forgettable (an exact receipt), and count once."""
    tenant_id, c = tenant
    r = c.post("/v1/models", json={"name": "r", "algorithm": "passive_olu_restart", "loss": "logistic", "dim": 4,
                                   "bounds": {"x_norm": 1.0}, "domain_radius": 10.0, "l2": 0.05,
                                   "privacy": {"epsilon": 1.0, "delta": 1e-6},
                                   "hyperparameters": {"max_deletions": 4, "schedule": "strongly_convex"}})
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    learned = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(30, 4))}).json()
    assert learned["restart_on_forget"]["first_step"] == 1
    assert c.get("/v1/tenant").json()["usage"]["records"] == 30
    first = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).json()["receipts"][0]
    assert first["mechanism"].get("restart") is True
    assert c.get("/v1/tenant").json()["usage"]["records"] == 0  # 1 forgotten, 29 dropped by the restart
    later = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-7", "rec-8"]}).json()["receipts"]
    assert [x["mechanism"]["type"] for x in later] == ["exact", "exact"]  # still forgettable, exactly
    assert c.get("/v1/tenant").json()["usage"]["records"] == 0  # counted once: dropped, then forgotten
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(5, 4), prefix="new")}).status_code == 200
    assert c.get("/v1/tenant").json()["usage"]["records"] == 5
    model = c.get(f"/v1/models/{mid}").json()
    assert (model["n_records"], model["n_forgotten"]) == (35, 3)
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    assert c.get("/v1/tenant").json()["usage"] == {**c.get("/v1/tenant").json()["usage"], "models": 0, "records": 0,
                                                   "bytes": 0}
