"""Issue 36 item 4: long work as operations (202 Accepted, GET /v1/operations/{id}, cancel), in-process.

On SQLite and PostgreSQL (the ``server`` fixture).  A retrain over the request budget (forced with a tiny
OLU_MAX_REQUEST_WORK) answers 202 and an operation whose progress moves and which succeeds; a cancel stops it with
nothing applied; another tenant gets 404; a bulk unlearn over max_forget_batch forgets in committed batches with one
receipt per id, in order; a learn over max_learn_batch learns in chunks; a commit of a process that lost its lease is
refused (fencing); the stored request holds no record id and is shredded at the end.  Crashes and take-overs by other
processes: tests/test_operations_crash.py.
"""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select, text, update

from app.db.tables import Operation, OperationPayload
from app.unlearning.contract.errors import checkpoint
from app.unlearning.families.sisa import SISA

from .helpers import create_model, examples, unit_rows, verify_receipt


class Pause:
    """Pauses every sisa shard replay after the first ``after`` of them (the engine's checkpoint keeps being called,
    so a cancel or a lost lease still stops it) until ``go``."""

    def __init__(self, monkeypatch, after: int = 1):
        self.go, self.entered, self.calls, self.after = threading.Event(), threading.Event(), 0, after
        original = SISA._replay_shard

        def replay(engine, *a, **kw):
            out = original(engine, *a, **kw)
            self.calls += 1
            if self.calls >= self.after and not self.go.is_set():
                self.entered.set()
                while not self.go.wait(0.02):
                    checkpoint()
            return out

        monkeypatch.setattr(SISA, "_replay_shard", replay)


@pytest.fixture
def pause(monkeypatch):
    p = Pause(monkeypatch)
    yield p
    p.go.set()


def wait_for(c, op_id: str, cond, what: str, limit: float = 60.0) -> dict:
    ends = time.monotonic() + limit
    while True:
        op = c.get(f"/v1/operations/{op_id}")
        assert op.status_code == 200, op.text
        op = op.json()
        if cond(op):
            return op
        if time.monotonic() > ends:
            raise AssertionError(f"timed out waiting for {what}: {op}")
        time.sleep(0.05)


def ended(op: dict) -> bool:
    return op["status"] in ("succeeded", "failed", "cancelled")


def sisa_model(c, n: int = 40, shards: int = 4, **hp) -> str:
    mid = create_model(c, dim=3, algorithm="sisa", hyperparameters={"shards": shards, **hp})["id"]
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(n, 3))})
    assert r.status_code == 200, r.text
    return mid


def test_a_retrain_over_the_budget_answers_202_and_its_progress_moves_to_success(server, tenant, pause, monkeypatch):
    _, c = tenant
    mid = sisa_model(c)
    before = c.get(f"/v1/models/{mid}").json()
    settings = server.app.state.ctx.settings
    monkeypatch.setattr(settings, "max_request_work", 1.0)  # every retrain is now over one request's budget
    r = c.post(f"/v1/models/{mid}/retrain")
    assert r.status_code == 202, r.text
    op = r.json()
    assert r.headers["location"] == f"/v1/operations/{op['id']}" and "preference-applied" not in r.headers
    assert op["kind"] == "retrain" and op["model_id"] == mid and op["status"] in ("queued", "running")
    assert op["progress"] == {"done": 0, "total": 40} and op["result"] is None and op["error"] is None
    assert pause.entered.wait(60)
    mid_way = wait_for(c, op["id"], lambda o: o["progress"]["done"] > 0, "progress")
    assert mid_way["status"] == "running" and 0 < mid_way["progress"]["done"] < 40, mid_way  # one shard of four
    assert mid_way["started_at"] is not None and mid_way["attempts"] == 1
    assert c.get(f"/v1/models/{mid}").json()["version"] == before["version"]  # nothing applied before the commit
    pause.go.set()
    done = wait_for(c, op["id"], ended, "the end")
    assert done["status"] == "succeeded", done
    assert done["progress"] == {"done": 40, "total": 40} and done["finished_at"] is not None
    after = c.get(f"/v1/models/{mid}").json()
    assert done["result"] == {"version": before["version"] + 1, "epoch": before["epoch"] + 1} 
    assert (after["version"], after["epoch"]) == (before["version"] + 1, before["epoch"] + 1)
    kinds = [e["kind"] for e in c.get(f"/v1/models/{mid}/ledger").json()["entries"]]
    assert kinds.count("retrain") == 1
    monkeypatch.setattr(settings, "max_request_work", 3e9)  # within the budget: answered at once, as before
    r = c.post(f"/v1/models/{mid}/retrain")
    assert r.status_code == 200 and r.json()["version"] == before["version"] + 2, r.text


def test_prefer_respond_async_and_an_idempotent_replay_keep_the_location(tenant):
    _, c = tenant
    mid = sisa_model(c, n=8)
    headers = {"Prefer": "wait=5, respond-async", "Idempotency-Key": "retrain-once"}
    first = c.post(f"/v1/models/{mid}/retrain", headers=headers)
    assert first.status_code == 202 and first.headers["preference-applied"] == "respond-async", first.text
    again = c.post(f"/v1/models/{mid}/retrain", headers=headers)
    assert again.status_code == 202 and again.headers.get("idempotent-replayed") == "true"
    assert again.json()["id"] == first.json()["id"] and again.headers["location"] == first.headers["location"]
    assert wait_for(c, first.json()["id"], ended, "the end")["status"] == "succeeded"
    listed = c.get("/v1/operations", params={"model_id": mid}).json()["items"]
    assert [o["id"] for o in listed] == [first.json()["id"]]  # one operation for the two requests


def test_cancel_stops_a_running_retrain_with_nothing_applied_and_a_queued_one_at_once(server, tenant, pause):
    _, c = tenant
    mid, other = sisa_model(c), sisa_model(c, n=8)
    before = c.get(f"/v1/models/{mid}").json()
    op = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
    assert pause.entered.wait(60)  # running, paused after its first shard
    queued = c.post(f"/v1/models/{other}/retrain", headers={"Prefer": "respond-async"}).json()  # one worker: waits
    got = c.post(f"/v1/operations/{queued['id']}/cancel")
    assert got.status_code == 200 and got.json()["status"] == "cancelled" and got.json()["cancel_requested"], got.text
    asked = c.post(f"/v1/operations/{op['id']}/cancel").json()
    assert asked["cancel_requested"] and asked["status"] in ("running", "cancelled")
    stopped = wait_for(c, op["id"], ended, "the cancel")
    assert stopped["status"] == "cancelled" and stopped["result"] is None and stopped["error"] is None, stopped
    after = c.get(f"/v1/models/{mid}").json()
    assert (after["version"], after["epoch"]) == (before["version"], before["epoch"])
    assert c.post(f"/v1/operations/{op['id']}/cancel").json()["status"] == "cancelled"  # ended: as it is
    assert c.get(f"/v1/models/{other}").json()["epoch"] == 1
    listed = c.get("/v1/operations", params={"status": "cancelled"}).json()["items"]
    assert {o["id"] for o in listed} >= {op["id"], queued["id"]}


def test_another_tenant_gets_404_and_scopes_apply(server, tenant):
    tenant_id, c = tenant
    mid = sisa_model(c, n=8)
    op = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
    wait_for(c, op["id"], ended, "the end")
    _, other = server.new_tenant("other")
    with server.client(other) as o:
        for r in (o.get(f"/v1/operations/{op['id']}"), o.post(f"/v1/operations/{op['id']}/cancel"),
                  o.get(f"/v1/operations/{op['id']}/receipts")):
            assert r.status_code == 404 and r.json()["type"] == "/problems/operation-not-found", r.text
        assert o.get("/v1/operations").json()["items"] == []
    with server.admin() as a:
        predict = a.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["predict"]}).json()["api_key"]
    with server.client(predict) as p:
        assert p.get(f"/v1/operations/{op['id']}").status_code == 200  # any key of the tenant reads it
        assert p.post(f"/v1/operations/{op['id']}/cancel").status_code == 403
        assert p.get(f"/v1/operations/{op['id']}/receipts").status_code == 403
    assert c.get("/v1/operations/op_" + "0" * 30).status_code == 404
    assert c.get("/v1/operations/not-an-id").status_code == 404  # as every unknown id (no control characters: 422)


def test_a_bulk_unlearn_forgets_in_committed_batches_with_one_receipt_per_id_in_order(server, tenant):
    _, c = tenant
    mid = create_model(c, dim=3, algorithm="retrain", hyperparameters={"max_forget_batch": 3})["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(20, 3))}).status_code == 200
    version = c.get(f"/v1/models/{mid}").json()["version"]
    ids = [f"rec-{i}" for i in (7, 1, 12, 3, 9, 0, 18, 5, 11, 2)]
    refused = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids + ["nope"]})
    assert refused.status_code == 404 and "'nope'" in refused.json()["detail"]  # checked before any operation
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids})
    assert r.status_code == 202, r.text  # 10 ids > max_forget_batch 3: no Prefer needed
    op = wait_for(c, r.json()["id"], ended, "the end")
    assert op["status"] == "succeeded" and op["progress"] == {"done": 10, "total": 10}, op
    assert op["result"] == {"version": version + 4, "forgotten": 10,
                            "receipts": f"/v1/operations/{op['id']}/receipts"}  # 4 batches: 3 + 3 + 3 + 1
    receipts, cursor = [], None
    while True:
        page = c.get(op["result"]["receipts"], params={"limit": 4, **({"cursor": cursor} if cursor else {})}).json()
        receipts += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    keys = c.get("/v1/keys").json()
    assert len(receipts) == 10 and all(verify_receipt(rc, keys["keys"]) for rc in receipts)
    for rid, receipt in zip(ids, receipts):  # in the order of the request's ids
        status = c.get(f"/v1/audit/records/{rid}").json()
        assert status["models"][0]["receipt_id"] == receipt["id"], (rid, status)
    assert c.get(f"/v1/models/{mid}").json()["n_forgotten"] == 10
    again = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids[:5]})
    assert again.status_code == 409 and again.json()["type"] == "/problems/record-already-forgotten"


def test_a_large_learn_runs_in_chunks(tenant):
    _, c = tenant
    mid = create_model(c, dim=3, algorithm="retrain", hyperparameters={"max_learn_batch": 5})["id"]
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(12, 3))})
    assert r.status_code == 202, r.text
    op = wait_for(c, r.json()["id"], ended, "the end")
    assert op["status"] == "succeeded" and op["kind"] == "learn", op
    assert op["result"] == {"accepted": 12, "first_step": 1, "last_step": 12, "version": 4}  # three chunks
    m = c.get(f"/v1/models/{mid}").json()
    assert (m["n_records"], m["step"], m["version"]) == (12, 12, 4)
    dup = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 3), prefix="rec", start=10)})
    assert dup.status_code == 409 and dup.json()["type"] == "/problems/duplicate-record"  # checked at creation


def test_a_commit_after_the_lease_was_taken_over_is_refused(server, tenant, pause):
    _, c = tenant
    mid = sisa_model(c)
    before = c.get(f"/v1/models/{mid}").json()
    op = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
    assert pause.entered.wait(60)
    db = server.app.state.ctx.db
    with db.write() as s:  # another process took the operation over (a new fencing token)
        s.execute(update(Operation).where(Operation.id == op["id"]).values(fence="f" * 32))
    runner = server.app.state.ctx.operation_runner
    pause.go.set()
    ends = time.monotonic() + 60
    while runner.outcomes.get(op["id"]) is None:
        assert time.monotonic() < ends
        time.sleep(0.02)
    assert runner.outcomes[op["id"]] == "lost"
    after = c.get(f"/v1/models/{mid}").json()
    assert (after["version"], after["epoch"]) == (before["version"], before["epoch"])  # nothing committed
    assert c.get(f"/v1/operations/{op['id']}").json()["status"] == "running"  # the other process's now
    with db.write() as s:
        s.execute(update(Operation).where(Operation.id == op["id"]).values(status="failed"))


def test_the_stored_request_holds_no_record_id_and_is_shredded_at_the_end(server, tenant, monkeypatch):
    _, c = tenant
    pause = Pause(monkeypatch, after=1)
    try:
        mid = create_model(c, dim=3, algorithm="sisa", hyperparameters={"shards": 2, "max_forget_batch": 2})["id"]
        secret = [f"patient-{i}-0b7e1c" for i in range(8)]
        rows = unit_rows(8, 3)
        body = {"examples": [{"id": rid, "x": x.tolist(), "y": float(i % 2)}
                             for i, (rid, x) in enumerate(zip(secret, rows))]}
        assert c.post(f"/v1/models/{mid}/learn", json=body).status_code == 200
        op = c.post(f"/v1/models/{mid}/unlearn", json={"ids": secret[:6]}).json()
        assert pause.entered.wait(60)  # the first batch is computing; the other chunks wait, sealed
        db = server.app.state.ctx.db
        with db.read() as s:
            chunks = [bytes(b) for b in s.scalars(select(OperationPayload.sealed)
                                                  .where(OperationPayload.operation_id == op["id"]))]
            assert len(chunks) == 3 and s.scalar(select(Operation.wrapped_key).where(Operation.id == op["id"]))
        assert not any(rid.encode() in chunk for rid in secret for chunk in chunks)
        if server.backend == "sqlite":
            raw = (server.data_dir / "olu.db").read_bytes() + (server.data_dir / "olu.db-wal").read_bytes()
            assert not any(rid.encode() in raw for rid in secret)
        pause.go.set()
        assert wait_for(c, op["id"], ended, "the end")["status"] == "succeeded"
        with db.read() as s:
            assert s.scalar(select(Operation.wrapped_key).where(Operation.id == op["id"])) is None
            left = s.execute(text("SELECT count(*) FROM operation_payloads WHERE operation_id = :o"),
                             {"o": op["id"]}).scalar()
        assert left == 0
    finally:
        pause.go.set()


def test_an_operation_on_a_model_deleted_before_it_ran_fails_with_its_problem(server, tenant, pause):
    _, c = tenant
    busy, gone = sisa_model(c), sisa_model(c, n=8)
    first = c.post(f"/v1/models/{busy}/retrain", headers={"Prefer": "respond-async"}).json()
    assert pause.entered.wait(60)  # the process's one worker is busy: the next one waits
    op = c.post(f"/v1/models/{gone}/retrain", headers={"Prefer": "respond-async"}).json()
    assert c.delete(f"/v1/models/{gone}").status_code == 204
    pause.go.set()
    failed = wait_for(c, op["id"], ended, "the end")
    assert failed["status"] == "failed" and failed["result"] is None, failed
    assert failed["error"]["type"] == "/problems/model-not-found" and failed["error"]["status"] == 404
    assert failed["error"]["title"] == "Model not found"
    assert wait_for(c, first["id"], ended, "the first")["status"] == "succeeded"


def test_a_key_rotation_rewraps_the_sealed_request_of_an_operation_not_yet_ended(tmp_path):
    import base64
    import os

    from app.config import Settings
    from app.crypto import Cipher
    from app.db import operation_payloads as payloads
    from app.db.migrate import upgrade_to_head
    from app.db.reseal import reseal_all
    from app.db.session import Database
    from app.db.tables import Tenant
    from app.ids import utcnow
    from app.services.operations import Lease, OperationStore

    k1, k2 = os.urandom(32), os.urandom(32)
    db = Database(f"sqlite:///{tmp_path / 'olu.db'}")
    upgrade_to_head(db.engine)
    store = OperationStore(db, Cipher(k1), Settings(data_dir=tmp_path))
    with db.write() as s:
        s.add(Tenant(id="ten_x", name="x", record_key=base64.b64encode(os.urandom(32)), created_at=utcnow()))
        s.flush()
        op = store.create(s, "ten_x", "mdl_x", "unlearn", 2, [{"start": 0, "digests": b"\1" * 64}])
    assert reseal_all(db, Cipher(k2, [k1]))["operation_keys"] == 1
    assert reseal_all(db, Cipher(k2))["operation_keys"] == 0  # already under the active key
    lease = Lease(op.id, "ten_x", "mdl_x", "unlearn", "-", 2, 0, False, None)
    assert OperationStore(db, Cipher(k2), store.settings).chunk(lease, 0) == {"start": 0, "digests": b"\1" * 64}
    with db.write() as s:
        payloads.shred(s, op.id)
    with pytest.raises(Exception, match="shredded"):
        OperationStore(db, Cipher(k2), store.settings).chunk(lease, 0)
    db.dispose()


def test_a_models_operations_run_in_order_whichever_process_claims_them(tmp_path):
    """A queued operation is claimed only once no operation of its model runs in any process (its lease valid or
    not) and none was queued before it: a process restarted beside a dead one's running unlearn, or a second replica,
    does not start the retrain queued behind it (tests/test_operations_crash.py saw it run first after a restart)."""
    import base64
    import os

    from app.config import Settings
    from app.crypto import Cipher
    from app.db.migrate import upgrade_to_head
    from app.db.session import Database
    from sqlalchemy import select

    from app.db.tables import Operation, Tenant
    from app.ids import utcnow
    from app.services.operations import OperationStore

    db = Database(f"sqlite:///{tmp_path / 'olu.db'}")
    upgrade_to_head(db.engine)
    store = OperationStore(db, Cipher(os.urandom(32)), Settings(data_dir=tmp_path))
    with db.write() as s:
        s.add(Tenant(id="ten_x", name="x", record_key=base64.b64encode(os.urandom(32)), created_at=utcnow()))
        s.flush()
        first = store.create(s, "ten_x", "mdl_x", "unlearn", 2).id
        second = store.create(s, "ten_x", "mdl_x", "retrain", 1).id
        other = store.create(s, "ten_x", "mdl_y", "retrain", 1).id

    def ids():
        return [c.id for c in store.candidates()]

    assert ids() == [first, other]  # the retrain waits behind the older unlearn of its model
    by_id = {c.id: c for c in store.candidates(50)}
    with db.read() as s:
        row = s.execute(select(Operation.id, Operation.tenant_id, Operation.model_id, Operation.status,
                               Operation.fence).where(Operation.id == second)).one()
    assert store.claim(row, "replica-b") is None  # an older operation of the model is queued
    lease = store.claim(by_id[first], "replica-a")
    assert lease is not None and lease.id == first
    assert ids() == [other]  # the unlearn runs (a valid lease, any process): the retrain still waits
    assert store.claim(row, "replica-b") is None
    db.dispose()
