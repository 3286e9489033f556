"""Round trip over HTTP on every backend: learn -> predict -> unlearn -> receipt verifies -> forgotten."""
from __future__ import annotations

import hashlib
import math

import numpy as np

from .helpers import create_model, examples, unit_rows, verify_receipt


def test_learn_predict_unlearn_receipt_round_trip(server, tenant):
    tenant_id, c = tenant
    model = create_model(c, dim=5)
    mid = model["id"]
    assert model["version"] == 1 and model["status"] == "ready" and model["step"] == 0
    X = unit_rows(40, 5, seed=1)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X)})
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 40, "first_step": 1, "last_step": 40, "version": 2}

    r = c.post(f"/v1/models/{mid}/predict", json={"x": X[:3].tolist()})
    assert r.status_code == 200
    pred = r.json()
    assert pred["version"] == 2 and len(pred["predictions"]) == 3
    assert all(p in (0.0, 1.0) for p in pred["predictions"]) and all(0 < s < 1 for s in pred["scores"])

    params_before = c.get(f"/v1/models/{mid}/parameters").json()
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0", "rec-17"]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["version"] == 3 and len(out["receipts"]) == 2
    params = c.get(f"/v1/models/{mid}/parameters").json()
    assert params["version"] == 3 and params["weights"] != params_before["weights"]  # noise went into the state

    keys = c.get("/v1/keys").json()["keys"]
    for receipt, learned in zip(out["receipts"], (1, 18)):
        assert verify_receipt(receipt, keys)
        assert receipt["learned_step"] == learned and receipt["forgotten_step"] == 40
        assert receipt["model_id"] == mid and receipt["tenant_id"] == tenant_id
        assert receipt["mechanism"]["type"] == "discrete_gaussian" and receipt["mechanism"]["sigma"] > 0
        assert receipt["model_version"] == 3
        raw = np.asarray(params["weights"] + [params["bias"]], dtype="<f8").tobytes()
        assert receipt["published_parameters_sha256"] == hashlib.sha256(raw).hexdigest()
        assert "rec-" not in receipt["record_commitment"]  # only the HMAC commitment is stored and shown
        # the stored receipt is the one returned
        got = c.get(f"/v1/receipts/{receipt['id']}").json()
        assert {k: v for k, v in got.items() if k != "proof"} == {k: v for k, v in receipt.items() if k != "proof"}
        assert verify_receipt(got, keys)
    assert [rc["log_index"] for rc in out["receipts"]] == [0, 1]
    # the mechanism is named with its grid (app/unlearning/mechanism/release.py); the last release made the published point
    for receipt in out["receipts"]:
        mech = receipt["mechanism"]
        assert mech["rounding"] == "nearest_even" and mech["grid"] > 0
        assert math.log2(mech["grid"]) == int(math.log2(mech["grid"]))  # a power of two
        assert mech["sensitivity"] > 0 and mech["sigma"] / mech["sensitivity"] > 1
    w = np.asarray(params["weights"] + [params["bias"]])
    g = out["receipts"][-1]["mechanism"]["grid"]
    if np.linalg.norm(w) < 10.0 * (1 - 1e-9):  # the projection onto K did not bind: the published point is g * integers
        assert np.array_equal(w / g, np.rint(w / g))
    assert out["receipts"][1]["ledger_after"]["rho_spent"] > out["receipts"][0]["ledger_after"]["rho_spent"]

    # a tampered receipt does not verify
    forged = dict(out["receipts"][0], forgotten_step=41)
    assert not verify_receipt(forged, keys)

    status = c.get("/v1/audit/records/rec-0").json()
    assert status["models"] == [{"model_id": mid, "status": "forgotten", "step": 1,
                                 "receipt_id": out["receipts"][0]["id"]}]
    assert c.get("/v1/audit/records/rec-5").json()["models"][0]["status"] == "learned"

    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert ledger["accounting"] == "omega_series" and len(ledger["entries"]) == 2
    assert abs(ledger["rho_spent"] - sum(e["rho"] for e in ledger["entries"])) < 1e-15
    assert ledger["rho_spent"] < ledger["rho_budget"]
    assert 0 < ledger["epsilon"] < 1.0  # spent epsilon stays below the model's target

    deletions = c.get(f"/v1/models/{mid}/deletions", params={"limit": 1}).json()
    assert len(deletions["items"]) == 1 and deletions["next_cursor"] is not None
    rest = c.get(f"/v1/models/{mid}/deletions", params={"cursor": deletions["next_cursor"]}).json()
    assert [d["id"] for d in deletions["items"] + rest["items"]] == [rc["id"] for rc in out["receipts"]]

    m = c.get(f"/v1/models/{mid}").json()
    assert (m["n_records"], m["n_forgotten"], m["step"], m["version"]) == (40, 2, 40, 3)


def test_other_tenant_sees_404_everywhere(server, tenant):
    _, c = tenant
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(3, 2))})
    receipt = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).json()["receipts"][0]
    _, other_key = server.new_tenant("other")
    with server.client(other_key) as o:
        calls = [
            ("GET", f"/v1/models/{mid}", None),
            ("DELETE", f"/v1/models/{mid}", None),
            ("POST", f"/v1/models/{mid}/learn", {"examples": examples(unit_rows(1, 2), prefix="x")}),
            ("POST", f"/v1/models/{mid}/unlearn", {"ids": ["rec-1"]}),
            ("POST", f"/v1/models/{mid}/predict", {"x": [[0.0, 0.0]]}),
            ("GET", f"/v1/models/{mid}/parameters", None),
            ("GET", f"/v1/models/{mid}/ledger", None),
            ("GET", f"/v1/models/{mid}/deletions", None),
            ("GET", f"/v1/receipts/{receipt['id']}", None),
            ("GET", "/v1/audit/records/rec-1", None),
        ]
        for method, path, body in calls:
            r = o.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert mid not in r.text.replace(path, "") or "detail" in r.json()
        assert o.get("/v1/models").json()["items"] == []
    # and nothing changed for the owner
    assert c.get(f"/v1/models/{mid}").json()["n_forgotten"] == 1


def test_delete_model_erases_state_keeps_receipts(server, tenant):
    _, c = tenant
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(4, 2))})
    rid = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-2"]}).json()["receipts"][0]["id"]
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    assert c.get(f"/v1/models/{mid}").status_code == 404
    assert c.post(f"/v1/models/{mid}/predict", json={"x": [[0, 0]]}).status_code == 404
    assert c.get(f"/v1/receipts/{rid}").status_code == 200
    assert [d["id"] for d in c.get(f"/v1/models/{mid}/deletions").json()["items"]] == [rid]
    # the forgotten record still shows with its receipt; the merely learned ones were erased with the model
    assert c.get("/v1/audit/records/rec-2").json()["models"][0]["receipt_id"] == rid
    assert c.get("/v1/audit/records/rec-1").json()["models"][0]["status"] == "erased_with_model"
    from sqlalchemy import select

    from app.db.tables import ModelState, Record, RecordBatch

    db = server.app.state.ctx.db
    with db.read() as s:  # of the records only their commitments remain, marked erased (test_model_erasure.py)
        assert {r.status for r in s.scalars(select(Record).where(Record.model_id == mid))} == {"erased"}
        assert s.scalars(select(RecordBatch).where(RecordBatch.model_id == mid)).first() is None
        assert s.get(ModelState, mid) is None


def test_models_list_pagination_and_scopes(server, tenant):
    tenant_id, c = tenant
    ids = [create_model(c, dim=1, name=f"m{i}")["id"] for i in range(3)]
    page = c.get("/v1/models", params={"limit": 2}).json()
    assert [m["id"] for m in page["items"]] == ids[:2]
    page2 = c.get("/v1/models", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [m["id"] for m in page2["items"]] == ids[2:] and page2["next_cursor"] is None

    with server.admin() as a:
        pk = a.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["predict"], "label": "app"}).json()
        audit = a.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["audit"]}).json()
    with server.client(pk["api_key"]) as p:
        assert p.post(f"/v1/models/{ids[0]}/predict", json={"x": [[0.5]]}).status_code == 200
        r = p.post(f"/v1/models/{ids[0]}/learn", json={"examples": [{"id": "a", "x": [0.1], "y": 1}]})
        assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem+json")
        assert p.get(f"/v1/models/{ids[0]}/ledger").status_code == 403
    with server.client(audit["api_key"]) as au:
        assert au.get(f"/v1/models/{ids[0]}/ledger").status_code == 200
        assert au.post(f"/v1/models/{ids[0]}/predict", json={"x": [[0.5]]}).status_code == 403
    with server.admin() as a:
        assert a.delete(f"/v1/tenants/{tenant_id}/keys/{pk['id']}").status_code == 204
        assert a.get("/v1/models").status_code == 403  # the admin token manages tenants and keys only
    with server.client(pk["api_key"]) as p:
        assert p.post(f"/v1/models/{ids[0]}/predict", json={"x": [[0.5]]}).status_code == 401
    with server.client() as anon:
        assert anon.get("/v1/models").status_code == 401
        assert anon.get("/v1/keys").status_code == 200
        assert anon.get("/healthz").json()["status"] == "ok"
        ready = anon.get("/readyz")
        checks = ready.json()["checks"]
        assert ready.status_code == 200 and checks.pop("kernels") in ("ok", "off")
        assert checks == {"database": "ok", "schema": "ok", "signing_key": "ok"}
