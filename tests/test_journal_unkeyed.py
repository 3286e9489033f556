"""No unkeyed trace of a forgotten record in the request journals (issue 37, F5-C), on SQLite and PostgreSQL.

The finding: ``idempotency_keys.request_hash`` was the SHA-256 of the canonical body, kept forever; from the
database alone a forgotten ``alice@example.com`` was confirmed, and its 4 binary features and label recovered, by
hashing 32 guesses -- the same for unlearn bodies (ids, and the whole example of a client-resend forget) and for
``stream_events.body_sha256``.  Here an attacker holding every byte of every table, but no key, hashes the same
guesses (and the record id alone, in several encodings) and finds none of them; the journal rows still replay."""
from __future__ import annotations

import hashlib
import itertools

import orjson
from sqlalchemy import select

from app.db.tables import Base, IdempotencyRecord
from app.schemas import LearnRequest, UnlearnRequest
from app.streaming.apply import Applier
from app.streaming.events import decode_event

from .helpers import create_model, examples, unit_rows

ALICE = "alice@example.com"
X_TRUE, Y_TRUE = [1.0, 0.0, 1.0, 1.0], 1.0
X_NORM = 2.0  # binary features: |x| <= 2


def _haystack(server) -> bytes:
    """Every value of every table, as stored: texts in UTF-8, blobs raw and in hex, numbers in decimal."""
    out = bytearray()
    with server.app.state.ctx.db.read() as s:
        for table in Base.metadata.sorted_tables:
            for row in s.execute(select(table)):
                for v in row:
                    if isinstance(v, (bytes, bytearray, memoryview)):
                        out += bytes(v) + b"\0" + bytes(v).hex().encode()
                    elif v is not None:
                        out += str(v).encode()
                    out += b"\0"
    return bytes(out)


def _unkeyed(data: bytes) -> list[bytes]:
    """What an unkeyed function of ``data`` looks like in a table: a digest, raw or hex."""
    out = []
    for h in (hashlib.sha256, hashlib.sha1, hashlib.md5, hashlib.sha512, hashlib.blake2b):
        d = h(data).digest()
        out += [d, d.hex().encode()]
    return out


def _learn_guesses(path: str) -> list[bytes]:
    """The attacker's 32 guesses of alice's learn body (4 binary features, a binary label), as the journal hashed it:
    method, path and the canonical body."""
    out = []
    for bits in itertools.product((0.0, 1.0), repeat=5):
        body = LearnRequest.model_validate({"examples": [{"id": ALICE, "x": list(bits[:4]), "y": bits[4]}]})
        out.append(b"POST " + path.encode() + b"\n" + body.model_dump_json().encode())
    return out


def _found(hay: bytes, candidates: list[bytes]) -> list[int]:
    return [i for i, c in enumerate(candidates) if any(d in hay for d in _unkeyed(c))]


def _binary_model(c, algorithm: str = "passive_olu", **hp) -> str:
    return create_model(c, algorithm=algorithm, bounds={"x_norm": X_NORM}, hyperparameters=hp)["id"]


def test_a_forgotten_record_leaves_no_unkeyed_trace_in_the_journals(server):
    tenant_id, key = server.new_tenant("journal")
    others = examples(unit_rows(6, 4, seed=5))
    with server.client(key) as c:
        # 1. HTTP learn and forget of alice with Idempotency-Keys (the finding's own request)
        mid = _binary_model(c)
        path = f"/v1/models/{mid}/learn"
        alice = {"examples": [{"id": ALICE, "x": X_TRUE, "y": Y_TRUE}]}
        learned = c.post(path, json=alice, headers={"Idempotency-Key": "learn-alice"})
        assert learned.status_code == 200, learned.text
        assert c.post(path, json={"examples": others}, headers={"Idempotency-Key": "learn-others"}).status_code == 200
        hay = _haystack(server)
        truth = _learn_guesses(path).index(
            b"POST " + path.encode() + b"\n" + LearnRequest.model_validate(alice).model_dump_json().encode())
        keyed = not _found(hay, _learn_guesses(path))  # before the forget: keyed, so already unguessable
        forget = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ALICE]}, headers={"Idempotency-Key": "forget-a"})
        assert forget.status_code == 200, forget.text
        # 2. a model whose clients resend the features to forget (memory_pair, deletion_features client)
        mp = _binary_model(c, "memory_pair", deletion_features="client", capacity=4)
        assert c.post(f"/v1/models/{mp}/learn", json={"examples": [*others, {"id": ALICE, "x": X_TRUE, "y": Y_TRUE}]},
                      headers={"Idempotency-Key": "mp-learn"}).status_code == 200
        resend = {"ids": [ALICE], "examples": [{"id": ALICE, "x": X_TRUE, "y": Y_TRUE}]}
        r = c.post(f"/v1/models/{mp}/unlearn", json=resend, headers={"Idempotency-Key": "mp-forget"})
        assert r.status_code == 200, r.text
        # 3. a learn and a client-resend forget through the broker path (olu consume's database side)
        st = _binary_model(c, "memory_pair", deletion_features="client", capacity=4)
        ctx = server.app.state.ctx
        applier = Applier(ctx.db, ctx.models, ctx.tenants, tenant_id, key, max_batch=100,
                          results_subject="r.{tenant}.{model}", dead_letter_subject="d.{tenant}.{model}")
        events = [orjson.dumps({"id": "e-learn", "kind": "learn", "body": {"examples": [
                      {"id": ALICE, "x": X_TRUE, "y": Y_TRUE}, *others]}}),
                  orjson.dumps({"id": "e-forget", "kind": "unlearn", "body": resend})]
        subject = f"olu.{tenant_id}.{st}.events"
        for seq, data in enumerate(events, start=1):
            ev = decode_event(data, {}, stream="OLU", seq=seq, subject=subject, model_id=st)
            assert [o.status for o in applier.apply_run([ev], applier.cursor("OLU", subject))] == ["applied"]

        hay = _haystack(server)
        # no guess of alice's learn body is confirmed, the true one included
        assert not _found(hay, _learn_guesses(path)), f"guess {truth} confirmed from the database alone"
        assert keyed
        # nor her forget bodies (ids only, and with the resent example), nor the broker messages, nor the bare id
        unlearn_bodies = [b"POST /v1/models/" + m.encode() + b"/unlearn\n" + UnlearnRequest.model_validate(b)
                          .model_dump_json().encode() for m in (mid, mp) for b in ({"ids": [ALICE]}, resend)]
        bare = [ALICE.encode(), orjson.dumps(ALICE), orjson.dumps([ALICE])]
        assert not _found(hay, unlearn_bodies + events + bare)
        assert ALICE.encode() not in hay
        # the answers still replay (the learn's fingerprint was erased with alice: replayed without a body check)
        again = c.post(path, json=alice, headers={"Idempotency-Key": "learn-alice"})
        assert again.status_code == 200 and again.json() == learned.json()
        assert again.headers.get("idempotent-replayed") == "true"
        assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": [ALICE]},
                      headers={"Idempotency-Key": "forget-a"}).json() == forget.json()
        # a redelivered broker event is taken as a duplicate, not applied again
        ev = decode_event(events[0], {}, stream="OLU", seq=1, subject=subject, model_id=st)
        assert [o.status for o in applier.apply_run([ev], applier.cursor("OLU", subject))] == ["duplicate"]
        # the other learn's row keeps its (keyed) fingerprint: another body under its key is still refused
        reused = c.post(path, json={"examples": examples(unit_rows(1, 4), prefix="z")},
                        headers={"Idempotency-Key": "learn-others"})
        assert reused.status_code == 422 and reused.json()["type"].endswith("/idempotency-key-reused")
    with server.app.state.ctx.db.read() as s:
        rows = {r.key: r for r in s.scalars(select(IdempotencyRecord).where(IdempotencyRecord.tenant_id == tenant_id))}
    assert rows["learn-alice"].request_hash == "" and rows["learn-others"].request_hash != ""
    assert rows["learn-alice"].first_step == rows["learn-alice"].last_step == 1


def test_journal_rows_expire_after_the_retention_window(server, tenant):
    from datetime import timedelta

    from sqlalchemy import update

    tenant_id, c = tenant
    mid = create_model(c)["id"]
    body = {"examples": examples(unit_rows(2, 4))}
    first = c.post(f"/v1/models/{mid}/learn", json=body, headers={"Idempotency-Key": "old"})
    assert first.status_code == 200
    store = server.app.state.ctx.idempotency
    with store.db.write() as s:  # the row was written longer ago than the retention window
        s.execute(update(IdempotencyRecord).where(IdempotencyRecord.tenant_id == tenant_id)
                  .values(created_at=IdempotencyRecord.created_at - timedelta(seconds=store.retention + 60)))
    assert store.purge() >= 1
    with store.db.read() as s:
        assert s.get(IdempotencyRecord, (tenant_id, "old")) is None
    # the key is free again: the same body is now a new learn (its ids were used: 409 duplicate-record)
    again = c.post(f"/v1/models/{mid}/learn", json=body, headers={"Idempotency-Key": "old"})
    assert again.status_code == 409 and again.json()["type"].endswith("/duplicate-record")


def test_an_error_on_a_record_lookup_logs_the_route_not_the_record_id(server, tenant, caplog, monkeypatch):
    """The error logs named the request by its path, which carries the record id of an audit lookup: an unkeyed
    (raw) trace in the service's log.  They name the route template."""
    import logging

    _, c = tenant
    audit = server.app.state.ctx.models.audit

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(audit, "record_status", broken)
    with caplog.at_level(logging.INFO):
        r = c.get(f"/v1/audit/records/{ALICE}")
    assert r.status_code == 500
    logged = "\n".join(rec.getMessage() for rec in caplog.records if rec.name.startswith("olu"))  # the service's
    assert "/v1/audit/records/{record_id}" in logged and ALICE not in logged
