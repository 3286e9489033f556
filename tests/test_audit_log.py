"""Receipts in the tenant's Merkle log: proofs, checkpoints, export bundles verified offline, tampering caught."""
from __future__ import annotations

import json

from sqlalchemy import delete, select, update

from app.db.tables import MerkleNode, Receipt
from app.receipts.canonical import receipt_leaf_bytes
from app.receipts.merkle import MerkleLog
from app.receipts.verify import verify_bundle

from .helpers import create_model, examples, unit_rows


def test_forget_100_export_and_verify_offline_then_detect_a_rewrite(server, tenant):
    tenant_id, c = tenant
    mid = create_model(c, dim=3)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(120, 3))})
    for start in range(0, 50, 10):
        assert c.post(f"/v1/models/{mid}/unlearn",
                      json={"ids": [f"rec-{i}" for i in range(start, start + 10)]}).status_code == 200
    old_cp = c.get("/v1/audit/checkpoint").json()  # an auditor keeps this signed tree head
    assert old_cp["tree_size"] == 50 and old_cp["origin"] == f"olu/{tenant_id}"
    for start in range(50, 100, 10):
        assert c.post(f"/v1/models/{mid}/unlearn",
                      json={"ids": [f"rec-{i}" for i in range(start, start + 10)]}).status_code == 200

    keys = c.get("/v1/keys").json()  # the only thing the offline verifier trusts
    bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
    assert len(bundle["receipts"]) == 100 and bundle["checkpoint"]["tree_size"] == 100
    report = verify_bundle(json.loads(json.dumps(bundle)), keys)
    assert report.ok, report.failures()
    one = c.get("/v1/audit/export", params={"record_id": "rec-7"}).json()
    assert len(one["receipts"]) == 1 and verify_bundle(one, keys).ok
    receipt = c.get(f"/v1/receipts/{one['receipts'][0]['id']}").json()
    assert receipt["proof"]["leaf_index"] == receipt["log_index"] == 7
    assert verify_bundle({"receipts": [receipt]}, keys).ok

    cons = c.get("/v1/audit/consistency", params={"from_size": 50, "to_size": 100}).json()
    honest = {"from": old_cp, "to": cons["to_checkpoint"], "hashes": cons["hashes"]}
    assert verify_bundle({"receipts": [], "consistency": honest}, keys).ok

    # tampering with any byte the auditor holds fails
    forged = json.loads(json.dumps(receipt))
    forged["mechanism"]["sigma"] *= 0.5
    assert not verify_bundle({"receipts": [forged]}, keys).ok

    # an insider rewrites one stored receipt (say, to hide a weaker guarantee) ...
    db = server.app.state.ctx.db
    with db.write() as s:
        row = s.scalars(select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.log_index == 7)).one()
        body = json.loads(row.body)
        body["mechanism"]["sigma"] = body["mechanism"]["sigma"] * 2
        s.execute(update(Receipt).where(Receipt.id == row.id).values(body=json.dumps(body).encode()))
    # ... the served receipt no longer matches the log
    served = c.get(f"/v1/receipts/{receipt['id']}").json()
    assert not verify_bundle({"receipts": [served]}, keys).ok
    # ... and if the insider also rebuilds the tree over the rewritten receipts, the log is no longer an
    # extension of the checkpoint the auditor kept
    with db.write() as s:
        s.execute(delete(MerkleNode).where(MerkleNode.tenant_id == tenant_id))
        from app.db.merkle_store import SqlNodeStore

        store = SqlNodeStore(s, tenant_id)
        log = MerkleLog(store)
        for i, r in enumerate(s.scalars(select(Receipt).where(Receipt.tenant_id == tenant_id)
                                        .order_by(Receipt.log_index))):
            log.append(receipt_leaf_bytes(json.loads(r.body)), i)
        store.flush()
    c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-100"]})
    new_cp = c.get("/v1/audit/checkpoint").json()
    assert new_cp["tree_size"] == 101
    cons = c.get("/v1/audit/consistency", params={"from_size": 50, "to_size": 101}).json()
    rewritten = {"from": old_cp, "to": new_cp, "hashes": cons["hashes"]}
    report = verify_bundle({"receipts": [], "consistency": rewritten}, keys)
    assert not report.ok and any(ch.check == "consistency.proof" and not ch.ok for ch in report.checks)


def test_checkpoint_and_consistency_edges(tenant):
    tenant_id, c = tenant
    cp = c.get("/v1/audit/checkpoint").json()
    assert cp["tree_size"] == 0
    r = c.get("/v1/audit/consistency", params={"from_size": 1})
    assert r.status_code == 422 and r.json()["type"] == "/problems/log-size-exceeded" and r.json()["log_size"] == 0
    mid = create_model(c, dim=1)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "a", "x": [0.5], "y": 1}, {"id": "b", "x": [0.1], "y": 0}]})
    c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["a", "b"]})
    assert c.get("/v1/audit/checkpoint").json()["tree_size"] == 2
    assert c.get("/v1/audit/consistency", params={"from_size": 3}).json()["type"] == "/problems/log-size-exceeded"
    assert c.get("/v1/audit/consistency", params={"from_size": 1, "to_size": 3}).status_code == 422
    r = c.get("/v1/audit/consistency", params={"from_size": 2, "to_size": 1})  # the request's own shape
    assert r.status_code == 422 and r.json()["type"] == "/problems/validation-error"
    ok = c.get("/v1/audit/consistency", params={"from_size": 1}).json()
    assert ok["to_size"] == 2 and len(ok["hashes"]) == 1
    assert c.get("/v1/audit/export").status_code == 422
    assert c.get("/v1/audit/export", params={"record_id": "zzz"}).status_code == 404
    d = c.get(f"/v1/models/{mid}/deletions", params={"since": "2000-01-01T00:00:00Z"}).json()["items"]
    assert len(d) == 2
    assert c.get(f"/v1/models/{mid}/deletions", params={"until": "2000-01-01T00:00:00Z"}).json()["items"] == []


def test_signing_key_rotation_keeps_old_receipts_verifiable(tmp_path):
    from app.receipts.keystore import rotate_key

    from .conftest import start_server

    url = f"sqlite:///{tmp_path / 'olu.db'}"
    srv, (uv, thread) = start_server(url, tmp_path, "sqlite")
    try:
        _, key = srv.new_tenant("rot")
        with srv.client(key) as c:
            mid = create_model(c, dim=2)["id"]
            c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(4, 2))})
            old_receipt = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).json()["receipts"][0]
            old_cp = c.get("/v1/audit/checkpoint").json()
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()
    new_ring = rotate_key(tmp_path)
    assert new_ring.key_id != old_receipt["key_id"]
    srv, (uv, thread) = start_server(url, tmp_path, "sqlite")
    try:
        with srv.client(key) as c:
            new_receipt = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]}).json()["receipts"][0]
            assert new_receipt["key_id"] == new_ring.key_id
            keys = c.get("/v1/keys").json()
            status = {k["key_id"]: k["status"] for k in keys["keys"]}
            assert status == {old_receipt["key_id"]: "retired", new_ring.key_id: "active"}
            bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
            report = verify_bundle(bundle, keys)
            assert report.ok, report.failures()
            assert [r["key_id"] for r in bundle["receipts"]] == [old_receipt["key_id"], new_ring.key_id]
            cons = c.get("/v1/audit/consistency", params={"from_size": 1}).json()
            proof = {"from": old_cp, "to": cons["to_checkpoint"], "hashes": cons["hashes"]}
            assert verify_bundle({"receipts": [], "consistency": proof}, keys).ok
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()
