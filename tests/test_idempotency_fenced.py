"""Issue 29 item 8: a take-over of an idempotent request is fenced.

A request that runs longer than OLU_IDEMPOTENCY_STALE_SECONDS has its claim taken over by a retry.  Before, the
original, still running, also committed when it finished: two retrains applied for one key.  Now completing a claim
checks its fencing token in the operation's own transaction, so the request that lost its claim changes nothing
(409 idempotency-request-in-progress) and the retry that took it over is the one answer.  On SQLite and PostgreSQL
(the ``server`` fixture's backends).
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.db.tables import IdempotencyRecord
from app.errors import Problem
from app.unlearning.families.retrain import RetrainOGD

from .helpers import add_tenant, create_model, examples, unit_rows


def _claim_age(store, tenant_id: str, key: str):
    with store.db.read() as s:
        return s.execute(select(IdempotencyRecord.created_at).where(IdempotencyRecord.tenant_id == tenant_id,
                                                                     IdempotencyRecord.key == key)).scalar_one()


def _make_stale(store, tenant_id: str, key: str) -> None:
    """The request has now run longer than the stale age (as if OLU_IDEMPOTENCY_STALE_SECONDS had passed)."""
    made = _claim_age(store, tenant_id, key)
    with store.db.write() as s:
        s.execute(update(IdempotencyRecord)
                  .where(IdempotencyRecord.tenant_id == tenant_id, IdempotencyRecord.key == key)
                  .values(created_at=made - timedelta(seconds=store.stale_after + 60)))


def _wait_until(cond, what: str, limit: float = 60.0) -> None:
    ends = time.monotonic() + limit
    while not cond():
        if time.monotonic() > ends:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_retrain_whose_claim_was_taken_over_does_not_commit(server, monkeypatch):
    tenant_id, key = server.new_tenant("fence")
    store = server.app.state.ctx.idempotency
    with server.client(key) as c:
        mid = create_model(c, dim=2, algorithm="retrain")["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 2))}).status_code == 200
        before = c.get(f"/v1/models/{mid}").json()

    entered, go, calls = threading.Event(), threading.Event(), []
    original = RetrainOGD.retrain

    def slow_retrain(self, retained):  # the first request's retrain runs "longer than the stale age"
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            go.wait(60)
        return original(self, retained)

    monkeypatch.setattr(RetrainOGD, "retrain", slow_retrain)
    out: dict = {}

    def post(name: str) -> None:
        with server.client(key) as cl:
            out[name] = cl.post(f"/v1/models/{mid}/retrain", headers={"Idempotency-Key": "once"})

    first = threading.Thread(target=post, args=("first",))
    first.start()
    try:
        assert entered.wait(60)
        _make_stale(store, tenant_id, "once")
        aged = _claim_age(store, tenant_id, "once")
        retry = threading.Thread(target=post, args=("retry",))
        retry.start()  # takes the claim over, then waits for the model's gate held by the first request
        _wait_until(lambda: _claim_age(store, tenant_id, "once") != aged, "the take-over")
    finally:
        go.set()
    first.join(60)
    retry.join(60)
    a, b = out["first"], out["retry"]
    assert a.status_code == 409 and a.json()["type"] == "/problems/idempotency-request-in-progress", a.text
    assert b.status_code == 200, b.text
    with server.client(key) as c:
        after = c.get(f"/v1/models/{mid}").json()
        assert after["version"] == before["version"] + 1 == b.json()["version"]  # one retrain applied, not two
        kinds = [e["kind"] for e in c.get(f"/v1/models/{mid}/ledger").json()["entries"]]
        assert kinds.count("retrain") == 1, kinds
        again = c.post(f"/v1/models/{mid}/retrain", headers={"Idempotency-Key": "once"})
        assert again.status_code == 200 and again.json() == b.json()
        assert again.headers.get("idempotent-replayed") == "true"


def test_a_guard_that_lost_its_claim_neither_completes_nor_releases_the_new_one(server):
    store = server.app.state.ctx.idempotency
    add_tenant(server.app.state.ctx, "ten_fence")  # a tenant row: fingerprints are keyed under its record key
    old = store.begin("ten_fence", "k", b"h")
    _make_stale(store, "ten_fence", "k")
    new = store.begin("ten_fence", "k", b"h")
    assert old.claim != new.claim
    with pytest.raises(Problem) as e:
        with store.db.write() as s:
            old.complete(s, {"x": 1})
    assert e.value.status == 409 and e.value.slug == "idempotency-request-in-progress"
    old.release()  # the loser's failure path must not drop the live claim
    with pytest.raises(Problem):
        store.begin("ten_fence", "k", b"h")  # still in progress (the new claim)
    with store.db.write() as s:
        new.complete(s, {"x": 2})
    replay = store.begin("ten_fence", "k", b"h")
    assert replay.body == b'{"x":2}'
