"""Deleting a model is a forget with a receipt (issue 13, item 3); so is deleting a tenant.

DELETE /v1/models/{id} appends exactly one signed erasure receipt (exact, rho = 0, the number of records the model
still held and the SHA-256 of their sorted commitments) to the tenant's log in the erasure's transaction; the audit
then says each such record was erased with the model under that receipt; the ledger and deletion log say the model
is deleted; the export bundle carries the receipt and `olu verify` checks it (signature, inclusion, count, hash).
"""
from __future__ import annotations

import copy
import hashlib
import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from app.cli import app as cli
from app.db.tables import ApiKey, ModelState, Record, RecordBatch, RetainedChunk, RetainedChunkKey
from app.receipts.verify import verify_bundle
from app.services.records import commitment

from .helpers import create_model, examples, unit_rows

runner = CliRunner()


def _commitments(server, tenant_id: str, record_ids) -> list[str]:
    ctx = server.app.state.ctx
    with ctx.db.read() as s:
        key = ctx.tenants.record_key(s, tenant_id)
    return sorted(commitment(key, r) for r in record_ids)


def _log_size(c) -> int:
    return c.get("/v1/audit/checkpoint").json()["tree_size"]


def _model_with_history(c, algorithm: str = "passive_olu", n: int = 6):
    """A model that learned rec-0..rec-{n-1} and forgot rec-2 (one certificate receipt)."""
    mid = create_model(c, dim=3, algorithm=algorithm)["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(n, 3))}).status_code == 200
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-2"]})
    assert r.status_code == 200, r.text
    return mid, r.json()["receipts"][0]["id"]


def test_delete_appends_one_verifiable_erasure_receipt(server, tenant, tmp_path):
    from app.receipts.canonical import erased_records_sha256

    tenant_id, c = tenant
    mid, forget_rid = _model_with_history(c)
    size = _log_size(c)
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    assert _log_size(c) == size + 1  # exactly one new leaf

    ledger = c.get(f"/v1/models/{mid}/ledger")
    assert ledger.status_code == 200
    ledger = ledger.json()
    assert ledger["model_status"] == "deleted" and ledger["deleted_at"] is not None
    rid = ledger["erasure_receipt_id"]
    assert rid and ledger["entries"][-1] == {"receipt_id": rid, "kind": "erasure", "step": 6, "sigma": 0.0,
                                             "rho": 0.0}

    receipt = c.get(f"/v1/receipts/{rid}").json()
    assert receipt["kind"] == "model_erasure" and receipt["model_id"] == mid and receipt["tenant_id"] == tenant_id
    assert receipt["mechanism"] == {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0}
    assert receipt["guarantee"]["definition"] == "exact" and receipt["guarantee"]["epsilon"] == 0.0
    assert receipt["log_index"] == size and receipt["proof"]["leaf_index"] == size
    assert (receipt["records_learned"], receipt["records_forgotten_before"]) == (6, 1)
    held = [f"rec-{i}" for i in (0, 1, 3, 4, 5)]
    expected = _commitments(server, tenant_id, held)
    assert receipt["records"]["erased"] == 5
    # the documented definition: SHA-256 over the sorted 32-byte commitments, concatenated
    assert receipt["records"]["commitments_sha256"] == hashlib.sha256(
        b"".join(sorted(bytes.fromhex(h) for h in expected))).hexdigest() == erased_records_sha256(expected)

    # the deletion log says the model is gone and names the receipt; its items stay the certificate receipts
    log = c.get(f"/v1/models/{mid}/deletions").json()
    assert (log["model_status"], log["erasure_receipt_id"]) == ("deleted", rid) and log["deleted_at"]
    assert [r["id"] for r in log["items"]] == [forget_rid]

    # the export bundle carries the erasure receipt and its commitments; olu verify checks all of it
    bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
    assert [r["id"] for r in bundle["receipts"]] == [forget_rid]
    assert len(bundle["erasures"]) == 1 and bundle["erasures"][0]["receipt"]["id"] == rid
    assert bundle["erasures"][0]["commitments"] == expected
    keys = c.get("/v1/keys").json()
    report = verify_bundle(bundle, keys)
    assert report.ok, str(report)
    names = {ch.check for ch in report.checks}
    assert {"erasure[0].signature", "erasure[0].inclusion", "erasure[0].erasure", "erasure[0].records"} <= names
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    (tmp_path / "keys.json").write_text(json.dumps(keys))
    out = runner.invoke(cli, ["verify", str(tmp_path / "bundle.json"), "--keys", str(tmp_path / "keys.json")])
    assert out.exit_code == 0 and "erasure[0].records" in out.output and "FAIL" not in out.output, out.output
    # a single erasure receipt as served verifies too
    (tmp_path / "one.json").write_text(json.dumps(receipt))
    out = runner.invoke(cli, ["verify", str(tmp_path / "one.json"), "--keys", str(tmp_path / "keys.json")])
    assert out.exit_code == 0 and "receipt[0].erasure" in out.output, out.output

    # tampering: a dropped commitment, a changed count, a non-zero rho are each caught
    dropped = copy.deepcopy(bundle)
    dropped["erasures"][0]["commitments"].pop()
    (tmp_path / "bad.json").write_text(json.dumps(dropped))
    out = runner.invoke(cli, ["verify", str(tmp_path / "bad.json"), "--keys", str(tmp_path / "keys.json")])
    assert out.exit_code == 1 and "FAIL erasure[0].records" in out.output, out.output
    swapped = copy.deepcopy(bundle)
    swapped["erasures"][0]["commitments"][0] = "0" * 64
    assert not verify_bundle(swapped, keys).ok
    recount = copy.deepcopy(bundle)
    recount["erasures"][0]["receipt"]["records"]["erased"] = 4
    failed = {ch.check for ch in verify_bundle(recount, keys).failures()}
    assert "erasure[0].signature" in failed and "erasure[0].records" in failed


def test_audit_says_erased_with_model(server, tenant):
    _, c = tenant
    mid, forget_rid = _model_with_history(c)
    assert c.get("/v1/audit/records/rec-1").json()["models"][0]["status"] == "learned"
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    rid = c.get(f"/v1/models/{mid}/ledger").json()["erasure_receipt_id"]
    deleted_at = c.get(f"/v1/models/{mid}/ledger").json()["deleted_at"]
    r = c.get("/v1/audit/records/rec-1")
    assert r.status_code == 200, r.text
    (entry,) = r.json()["models"]
    assert entry == {"model_id": mid, "status": "erased_with_model", "step": 2, "receipt_id": rid,
                     "erased_at": deleted_at}
    # a record forgotten before the deletion keeps answering with its own certificate receipt
    (forgot,) = c.get("/v1/audit/records/rec-2").json()["models"]
    assert (forgot["status"], forgot["receipt_id"]) == ("forgotten", forget_rid)
    assert c.get("/v1/audit/records/never-seen").status_code == 404
    # a record's bundle carries the erasure receipt (with its proof, without the model's commitment list)
    bundle = c.get("/v1/audit/export", params={"record_id": "rec-1"}).json()
    assert bundle["receipts"] == [] and [e["receipt"]["id"] for e in bundle["erasures"]] == [rid]
    assert bundle["erasures"][0]["commitments"] is None
    assert verify_bundle(bundle, c.get("/v1/keys").json()).ok
    # the same record id learned again by a new model: both answers, side by side
    mid2 = create_model(c, dim=3)["id"]
    c.post(f"/v1/models/{mid2}/learn", json={"examples": examples(unit_rows(2, 3))})
    statuses = {m["model_id"]: m["status"] for m in c.get("/v1/audit/records/rec-1").json()["models"]}
    assert statuses == {mid: "erased_with_model", mid2: "learned"}


def test_second_delete_issues_no_second_receipt(server, tenant):
    _, c = tenant
    mid, _ = _model_with_history(c)
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    size = _log_size(c)
    r = c.delete(f"/v1/models/{mid}")
    assert r.status_code == 404 and r.json()["type"].endswith("model-not-found")
    assert _log_size(c) == size
    assert len(c.get("/v1/audit/export", params={"model_id": mid}).json()["erasures"]) == 1
    # the write and read paths of a deleted model stay closed
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(1, 3), "new")}).status_code == 404
    assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]}).status_code == 404
    assert c.post(f"/v1/models/{mid}/predict", json={"x": [[0, 0, 0]]}).status_code == 404
    assert c.get(f"/v1/models/{mid}/parameters").status_code == 404
    assert c.get(f"/v1/models/{mid}").status_code == 404


def test_erasure_keeps_nothing_of_the_examples(server, tenant):
    """A data-holding family: retained examples, batches and state go; records keep only commitment and step."""
    _, c = tenant
    mid, _ = _model_with_history(c, algorithm="retrain", n=5)
    db = server.app.state.ctx.db
    with db.read() as s:
        assert s.scalars(select(RetainedChunk).where(RetainedChunk.model_id == mid)).first() is not None
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    with db.read() as s:
        assert s.scalars(select(RetainedChunk).where(RetainedChunk.model_id == mid)).first() is None
        assert s.scalars(select(RetainedChunkKey).where(RetainedChunkKey.model_id == mid)).first() is None
        assert s.scalars(select(RecordBatch).where(RecordBatch.model_id == mid)).first() is None
        assert s.get(ModelState, mid) is None
        rows = list(s.scalars(select(Record).where(Record.model_id == mid)))
    assert len(rows) == 4 and {r.status for r in rows} == {"erased"}
    assert all(r.example_mac is None and len(r.commitment) == 64 for r in rows)
    assert sorted(r.step for r in rows) == [1, 2, 4, 5]


def test_other_tenant_sees_nothing_of_the_erasure(server, tenant):
    _, c = tenant
    mid, _ = _model_with_history(c)
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    rid = c.get(f"/v1/models/{mid}/ledger").json()["erasure_receipt_id"]
    _, other_key = server.new_tenant("other")
    with server.client(other_key) as o:
        for path in (f"/v1/receipts/{rid}", f"/v1/models/{mid}/ledger", f"/v1/models/{mid}/deletions",
                     "/v1/audit/records/rec-1"):
            r = o.get(path)
            assert r.status_code == 404 and "erase" not in r.text and "deleted" not in r.text, (path, r.text)
        assert o.get("/v1/audit/export", params={"model_id": mid}).status_code == 404
        assert o.delete(f"/v1/models/{mid}").status_code == 404
    assert c.get(f"/v1/models/{mid}/ledger").json()["erasure_receipt_id"] == rid


def test_empty_model_erasure_hashes_the_empty_set(server, tenant):
    _, c = tenant
    mid = create_model(c, dim=2)["id"]
    assert c.delete(f"/v1/models/{mid}").status_code == 204
    rid = c.get(f"/v1/models/{mid}/ledger").json()["erasure_receipt_id"]
    receipt = c.get(f"/v1/receipts/{rid}").json()
    assert receipt["records"] == {"erased": 0, "commitments_sha256": hashlib.sha256(b"").hexdigest()}
    bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
    assert bundle["receipts"] == [] and bundle["erasures"][0]["commitments"] == []
    assert verify_bundle(bundle, c.get("/v1/keys").json()).ok


def test_live_model_ledger_says_live(server, tenant):
    _, c = tenant
    mid, _ = _model_with_history(c)
    ledger = c.get(f"/v1/models/{mid}/ledger").json()
    assert (ledger["model_status"], ledger["deleted_at"], ledger["erasure_receipt_id"]) == ("live", None, None)
    log = c.get(f"/v1/models/{mid}/deletions").json()
    assert (log["model_status"], log["erasure_receipt_id"]) == ("live", None)
    assert c.get("/v1/audit/export", params={"model_id": mid}).json()["erasures"] == []


# ---- tenant deletion --------------------------------------------------------------------------------------
def test_delete_tenant_erases_every_model_with_a_receipt(server):
    tenant_id, key = server.new_tenant("leaving")
    with server.client(key) as c:
        m1, _ = _model_with_history(c)
        m2 = create_model(c, dim=3, algorithm="retrain")["id"]
        c.post(f"/v1/models/{m2}/learn", json={"examples": examples(unit_rows(3, 3), "other")})
        gone = create_model(c, dim=2)["id"]
        assert c.delete(f"/v1/models/{gone}").status_code == 204
        size = _log_size(c)
    with server.client(key) as c:  # a tenant key cannot delete its tenant
        assert c.delete(f"/v1/tenants/{tenant_id}").status_code == 403
    with server.admin() as adm:
        r = adm.delete(f"/v1/tenants/{tenant_id}")
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["tenant_id"] == tenant_id and out["keys_revoked"] == 1 and out["deleted_at"]
        assert sorted(m["model_id"] for m in out["models_erased"]) == sorted([m1, m2])
        assert adm.delete(f"/v1/tenants/{tenant_id}").status_code == 404  # retry: nothing more
        assert adm.delete("/v1/tenants/ten_nope").status_code == 404
        # the tenant's keys are revoked; only audit keys can be made for a deleted tenant
        assert adm.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["write"]}).status_code == 409
        audit = adm.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["audit"]})
        assert audit.status_code == 201, audit.text
    with server.client(key) as c:
        assert c.get("/v1/models").status_code == 401
    db = server.app.state.ctx.db
    with db.read() as s:
        keys = list(s.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id)))
        assert sum(k.revoked_at is None for k in keys) == 1  # the new audit key only
        assert s.scalars(select(RecordBatch).where(RecordBatch.tenant_id == tenant_id)).first() is None
    with server.client(audit.json()["api_key"]) as a:
        assert _log_size(a) == size + 2  # one erasure receipt per live model, none for the deleted one
        for ref in out["models_erased"]:
            ledger = a.get(f"/v1/models/{ref['model_id']}/ledger").json()
            assert (ledger["model_status"], ledger["erasure_receipt_id"]) == ("deleted", ref["erasure_receipt_id"])
            bundle = a.get("/v1/audit/export", params={"model_id": ref["model_id"]}).json()
            assert verify_bundle(bundle, a.get("/v1/keys").json()).ok
        by_model = {m["model_id"]: m for m in a.get("/v1/audit/records/other-1").json()["models"]}
        receipt_of = {m["model_id"]: m["erasure_receipt_id"] for m in out["models_erased"]}
        assert by_model[m2]["status"] == "erased_with_model" and by_model[m2]["receipt_id"] == receipt_of[m2]
        assert a.post("/v1/models", json={"name": "x", "dim": 2, "bounds": {"x_norm": 1.0}}).status_code == 403


def test_erasure_is_rolled_back_with_its_transaction(server, tenant, monkeypatch):
    """The receipt is appended in the erasure's transaction: a failure after it leaves model and log as before."""
    _, c = tenant
    mid, _ = _model_with_history(c)
    size = _log_size(c)
    from app.db import retained

    def boom(self):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(retained.SqlRetained, "erase_all", boom)
    with pytest.raises(RuntimeError):
        server.app.state.ctx.models.delete(_tenant_of(server, mid), mid)
    monkeypatch.undo()
    assert _log_size(c) == size
    assert c.get(f"/v1/models/{mid}").status_code == 200
    assert c.get(f"/v1/models/{mid}/ledger").json()["model_status"] == "live"
    assert c.delete(f"/v1/models/{mid}").status_code == 204 and _log_size(c) == size + 1


def _tenant_of(server, model_id: str) -> str:
    from app.db.tables import Model

    with server.app.state.ctx.db.read() as s:
        return s.get(Model, model_id).tenant_id


def test_tenant_deletion_interrupted_is_finished_by_a_retry(server):
    """Keys revoked and the tenant marked, then a failure before its models are erased: the next DELETE erases
    them (one receipt each) instead of answering 404; once nothing is left, DELETE is 404."""
    tenant_id, key = server.new_tenant("interrupted")
    with server.client(key) as c:
        mid, _ = _model_with_history(c)
    ctx = server.app.state.ctx

    class Broken:
        def erase_tenant_models(self, s, tenant_id):
            raise RuntimeError("crash between the two transactions")

    with pytest.raises(RuntimeError):
        ctx.tenants.delete_tenant(tenant_id, Broken())
    with server.client(key) as c:
        assert c.get("/v1/models").status_code == 401  # the keys went in the first transaction
    with server.admin() as adm:
        r = adm.delete(f"/v1/tenants/{tenant_id}")
        assert r.status_code == 200, r.text
        assert [m["model_id"] for m in r.json()["models_erased"]] == [mid] and r.json()["keys_revoked"] == 0
        assert adm.delete(f"/v1/tenants/{tenant_id}").status_code == 404


def test_concurrent_deletes_issue_one_receipt(server, tenant):
    import concurrent.futures

    _, c = tenant
    mid, _ = _model_with_history(c)
    size = _log_size(c)
    key = c.headers["authorization"].split()[1]

    def delete(_):
        with server.client(key) as k:
            return k.delete(f"/v1/models/{mid}").status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = sorted(pool.map(delete, range(4)))
    assert codes == [204, 404, 404, 404]
    assert _log_size(c) == size + 1


# ---- the verifier's erasure checks, offline -----------------------------------------------------------------
def _signed_erasure(**changes):
    from app.receipts.canonical import erased_records_sha256
    from app.receipts.keys import KeyRing, SigningKey

    ring = KeyRing(SigningKey.generate())
    commits = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
    body = {"id": "rcp_x", "kind": "model_erasure", "tenant_id": "ten_x", "model_id": "mdl_x", "algorithm": "retrain",
            "mechanism": {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0},
            "guarantee": {"definition": "exact", "epsilon": 0.0, "delta": 0.0, "statement": "gone"},
            "records": {"erased": 3, "commitments_sha256": erased_records_sha256(commits)},
            "records_learned": 4, "records_forgotten_before": 1, "model_version": 7,
            "issued_at": "2026-11-25T08:00:00.000000Z", "log_index": 0}
    for path, value in changes.items():
        *head, last = path.split(".")
        target = body
        for k in head:
            target = target[k]
        target[last] = value
    return ring.sign_receipt(body), commits, ring.public_keys()


@pytest.mark.parametrize("changes, reason", [
    ({}, None),
    ({"mechanism.rho": 1e-3}, "mechanism is not exact"),
    ({"mechanism.type": "gaussian"}, "mechanism is not exact"),
    ({"guarantee.epsilon": 0.5}, "guarantee is not exact"),
    ({"records.erased": 4}, "only 3 were held"),
    ({"records.erased": -1}, "records must give"),
    ({"records.commitments_sha256": "ab"}, "records must give"),
    ({"records_forgotten_before": 5}, "0 <= forgotten <= learned"),
])
def test_verifier_checks_the_terms_of_an_erasure(changes, reason):
    from app.receipts.verify import VerificationReport, verify_receipt

    receipt, _, keys = _signed_erasure(**changes)
    report = VerificationReport()
    verify_receipt(receipt, keys, report)
    by = {c.check: c for c in report.checks}
    assert by["receipt.signature"].ok  # validly signed: only the terms can be wrong
    assert by["receipt.erasure"].ok == (reason is None), by["receipt.erasure"]
    if reason:
        assert reason in by["receipt.erasure"].detail


def test_verifier_checks_the_erased_commitments():
    receipt, commits, keys = _signed_erasure()

    def records_check(entry):
        report = verify_bundle({"receipts": [], "erasures": [entry]}, keys)
        return {c.check: c for c in report.checks}["erasure[0].records"]

    assert records_check({"receipt": receipt, "commitments": sorted(commits)}).ok
    assert records_check({"receipt": receipt, "commitments": commits[::-1]}).ok  # the hash sorts
    assert not records_check({"receipt": receipt, "commitments": commits[:2]}).ok
    assert not records_check({"receipt": receipt, "commitments": commits[:2] + commits[:1]}).ok
    assert not records_check({"receipt": receipt, "commitments": commits[:2] + ["f" * 64]}).ok
    assert not records_check({"receipt": receipt, "commitments": commits[:2] + ["xyz"]}).ok
    assert not verify_bundle({"receipts": [], "erasures": "nope"}, keys).ok
    assert not verify_bundle({"receipts": [], "erasures": [{"commitments": []}]}, keys).ok
    certificate = {k: v for k, v in receipt.items() if k != "kind"}
    report = verify_bundle({"erasures": [{"receipt": certificate, "commitments": None}]}, keys)
    assert "erasure[0].erasure" in {c.check for c in report.failures()}
