"""Long work as operations (issue 36 item 4; Google AIP-151): the operations table and its rules.

A retrain, a bulk unlearn or a learn whose work exceeds one request's budget (or that asks for it with ``Prefer:
respond-async``) is answered 202 with an operation (app/api/operations.py); a process then runs it
(app/services/operation_runner.py, app/services/operation_steps.py).  This module keeps the rows:

- **create**: in one transaction with the Idempotency-Key's answer; the request is kept only as sealed chunks of
  commitments and checked examples (app/db/operation_payloads.py), never raw record ids;
- **claim**: a process takes a queued operation, or a running one whose lease expired (its process died), with a
  conditional update on the fencing token it read; a take-over draws a new token and counts an attempt, and after
  ``operation_max_attempts`` the operation fails instead (operation-abandoned), nothing half-applied;
- **heartbeat**: the holder renews its lease (and writes a retrain's progress) while it computes; a heartbeat that
  finds another token has lost the lease, and the computation stops;
- **commit**: every write of an operation (the retrain, each batch of a bulk unlearn or large learn) runs
  ``commit`` inside the write's own transaction, a conditional update on the holder's token and on no cancel being
  asked: a process whose lease was taken over, or whose operation was cancelled, commits nothing (the whole
  transaction rolls back), as idempotency claims are fenced (app/services/idempotency.py);
- **end**: succeeded (in the last commit), failed (with its RFC 9457 problem), cancelled; the request's data key and
  chunks are destroyed in that transaction (crypto-shredding).
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import exists, func, insert, or_, select, text, update

from ..db import operation_payloads as payloads
from ..db.session import Database
from ..db.tables import Operation, OperationReceipt, Receipt
from ..errors import Problem
from ..ids import id_pattern, new_id, utcnow

_O = Operation.__table__
_OTHER = Operation.__table__.alias("other")
_CLAIM_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")


def _model_busy(model_id, op_id):
    """EXISTS: another operation of the model is running (in any process, its lease valid or not), or an older one
    of it is still queued: a queued operation waits for both."""
    return exists().where(_OTHER.c.model_id == model_id, _OTHER.c.id != op_id,
                          or_(_OTHER.c.status == "running", (_OTHER.c.status == "queued") & (_OTHER.c.id < op_id)))
KINDS = ("retrain", "unlearn", "learn")
ACTIVE = ("queued", "running")
_OP_ID = id_pattern("op")


class Fenced(Exception):
    """A commit of an operation whose lease this process no longer holds, or that was cancelled: rolled back."""


@dataclass
class Lease:
    """A process's hold on a running operation: the fencing token its commits are checked against."""
    id: str
    tenant_id: str
    model_id: str
    kind: str
    fence: str
    total: int
    done: int
    cancel_requested: bool
    result: dict[str, Any] | None


def problem_json(p: Problem) -> str:
    """What an operation keeps of a failure's problem (the API renders the RFC 9457 document from it)."""
    extra = {k: v for k, v in (p.extra or {}).items() if v is not None and isinstance(v, (str, int, float, list))}
    return json.dumps({"status": p.status, "slug": p.slug, "detail": p.detail, **extra})


def view(row: Operation) -> dict[str, Any]:
    """An operation as the API serves it (the problem as stored: the API renders it)."""
    return {"id": row.id, "kind": row.kind, "model_id": row.model_id, "status": row.status,
            "progress": {"done": int(row.done), "total": int(row.total)},
            "cancel_requested": bool(row.cancel_requested), "attempts": int(row.attempts),
            "created_at": row.created_at, "started_at": row.started_at, "updated_at": row.updated_at,
            "finished_at": row.finished_at,
            "result": None if row.result is None else json.loads(row.result),
            "error": None if row.problem is None else json.loads(row.problem)}


class OperationStore:
    def __init__(self, db: Database, cipher, settings):
        self.db, self.cipher, self.settings = db, cipher, settings
        self.on_created = None  # the local runner's wake-up (app/services/operation_runner.py)
        self.on_cancel = None  # the local runner's stop of an operation it runs

    @property
    def lease_seconds(self) -> float:
        return float(self.settings.operation_lease_seconds)

    # ---- the API's side ------------------------------------------------------------------------------------------
    def create(self, s, tenant_id: str, model_id: str, kind: str, total: int, chunks: list[dict] | None = None,
               operation_id: str | None = None) -> Operation:
        """A queued operation, in the caller's transaction (with the Idempotency-Key's answer)."""
        assert kind in KINDS
        now = utcnow()
        op_id = operation_id or new_id("op")
        wrapped = data_key = None
        if chunks:
            data_key, wrapped = payloads.new_data_key(self.cipher, op_id)
        row = Operation(id=op_id, tenant_id=tenant_id, model_id=model_id, kind=kind, status="queued", done=0,
                        total=int(total), cancel_requested=False, attempts=0, created_at=now, updated_at=now,
                        wrapped_key=wrapped)
        s.add(row)
        s.flush()
        if chunks:
            payloads.write_chunks(s, op_id, data_key, chunks)
        return row

    def created(self) -> None:
        """After the creating transaction committed: wake the local runner."""
        if self.on_created is not None:
            self.on_created()

    def _own(self, s, tenant_id: str, operation_id: str) -> Operation:
        row = s.scalars(select(Operation).where(Operation.id == operation_id, Operation.tenant_id == tenant_id)).first()
        if row is None:
            raise Problem(404, "operation-not-found", f"No operation {operation_id}.")
        return row

    def get(self, tenant_id: str, operation_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            return view(self._own(s, tenant_id, operation_id))

    def list(self, tenant_id: str, model_id: str | None, status: str | None, cursor: str | None,
             limit: int) -> dict[str, Any]:
        """The tenant's operations, newest first (``cursor``: the last id of the previous page)."""
        q = select(Operation).where(Operation.tenant_id == tenant_id)
        if model_id is not None:
            q = q.where(Operation.model_id == model_id)
        if status is not None:
            q = q.where(Operation.status == status)
        if cursor is not None:
            q = q.where(Operation.id < cursor)
        with self.db.read() as s:
            rows = list(s.scalars(q.order_by(Operation.id.desc()).limit(limit + 1)))
        more = len(rows) > limit
        rows = rows[:limit]
        return {"items": [view(r) for r in rows], "next_cursor": rows[-1].id if more else None}

    def cancel(self, tenant_id: str, operation_id: str) -> dict[str, Any]:
        """Ask an operation to stop.  Queued: cancelled at once.  Running: its process stops it at the next
        checkpoint, and no commit of it passes once asked (``commit``), so what it applied is what its progress
        says.  Ended: unchanged."""
        shredded = 0
        with self.db.write() as s:
            self._own(s, tenant_id, operation_id)
            now = utcnow()
            s.execute(update(_O).where(_O.c.id == operation_id, _O.c.status.in_(ACTIVE))
                      .values(cancel_requested=True, updated_at=now))
            if s.execute(update(_O).where(_O.c.id == operation_id, _O.c.status == "queued")
                         .values(status="cancelled", finished_at=now)).rowcount:
                shredded = payloads.shred(s, operation_id) + 1
        if shredded:
            self.db.scrub_wal()
        if self.on_cancel is not None:
            self.on_cancel(operation_id)
        return self.get(tenant_id, operation_id)

    def receipts(self, tenant_id: str, operation_id: str, cursor: str | None, limit: int) -> dict[str, Any]:
        """A bulk unlearn's receipts in the order of the request's ids (committed batches only)."""
        try:
            after = int(cursor) if cursor else -1
        except ValueError:
            raise Problem(422, "validation-error", "cursor must be a value returned as next_cursor.") from None
        r, o = Receipt.__table__, OperationReceipt.__table__
        with self.db.read() as s:
            self._own(s, tenant_id, operation_id)
            rows = s.execute(select(o.c.idx, r.c.body).select_from(o.join(r, r.c.id == o.c.receipt_id))
                             .where(o.c.operation_id == operation_id, o.c.idx > after)
                             .order_by(o.c.idx).limit(limit + 1)).all()
        more = len(rows) > limit
        rows = rows[:limit]
        return {"items": [json.loads(body) for _, body in rows], "next_cursor": str(rows[-1][0]) if more else None}

    # ---- the runner's side ---------------------------------------------------------------------------------------
    def candidates(self, limit: int = 20) -> list[Any]:
        """Operations a process may claim: running with an expired lease, or queued where no operation of the same
        model is running in any process nor queued before it (a model's operations run one after another, in the
        order they were asked for, whichever processes run them); oldest first."""
        now = utcnow()
        with self.db.read() as s:
            return s.execute(select(_O.c.id, _O.c.tenant_id, _O.c.model_id, _O.c.status, _O.c.fence)
                             .where(or_((_O.c.status == "queued") & ~_model_busy(_O.c.model_id, _O.c.id),
                                        (_O.c.status == "running") & (_O.c.lease_until < now)))
                             .order_by(_O.c.id).limit(limit)).all()

    def claim(self, candidate, owner: str) -> Lease | None:
        """Take ``candidate`` (a row of ``candidates``) if nobody did since it was read: a new fencing token and
        lease.  A cancelled one ends here; one that has had its attempts fails here (operation-abandoned)."""
        now = utcnow()
        held = _O.c.fence.is_(None) if candidate.fence is None else _O.c.fence == candidate.fence
        still = [_O.c.id == candidate.id, held, _O.c.status == candidate.status]
        if candidate.status == "running":
            still.append(_O.c.lease_until < now)
        token = secrets.token_hex(16)
        ended = False
        with self.db.write() as s:
            if candidate.status == "queued":
                # claims of one model's operations serialised (PostgreSQL: a transaction-scoped advisory lock on the
                # model id, apart from its row, which a write may hold for long; SQLite's write lock already does):
                # two processes never start two operations of one model, nor one while an earlier one runs elsewhere
                if not self.db.is_sqlite:
                    s.execute(_CLAIM_LOCK, {"key": f"olu-operations:{candidate.model_id}"})
                if s.execute(select(_model_busy(candidate.model_id, candidate.id))).scalar():
                    return None
            row = s.execute(select(_O.c.attempts, _O.c.cancel_requested).where(*still)).first()
            if row is None:
                return None
            if row.cancel_requested or row.attempts >= self.settings.operation_max_attempts:
                problem = None if row.cancel_requested else json.dumps({
                    "status": 500, "slug": "operation-abandoned",
                    "detail": f"The processes that ran this operation stopped {row.attempts} times without finishing "
                              "it (OLU_OPERATION_MAX_ATTEMPTS); nothing of the step they were on was applied."})
                if s.execute(update(_O).where(*still).values(
                        status="cancelled" if problem is None else "failed", problem=problem, finished_at=now,
                        updated_at=now, lease_until=None)).rowcount:
                    payloads.shred(s, candidate.id)
                    ended = True
            elif s.execute(update(_O).where(*still).values(
                    status="running", owner=owner[:80], fence=token, attempts=_O.c.attempts + 1, updated_at=now,
                    started_at=func.coalesce(_O.c.started_at, now),
                    lease_until=now + timedelta(seconds=self.lease_seconds))).rowcount:
                got = s.execute(select(_O).where(_O.c.id == candidate.id)).mappings().one()
                if got["kind"] == "retrain" and got["done"]:  # a retrain taken over starts again from its first record
                    s.execute(update(_O).where(_O.c.id == candidate.id).values(done=0))
                return Lease(got["id"], got["tenant_id"], got["model_id"], got["kind"], token, int(got["total"]),
                             int(got["done"]), bool(got["cancel_requested"]),
                             None if got["result"] is None else json.loads(got["result"]))
        if ended:
            self.db.scrub_wal()
        return None

    def _mine(self, lease: Lease) -> list:
        return [_O.c.id == lease.id, _O.c.fence == lease.fence, _O.c.status == "running"]

    def heartbeat(self, lease: Lease, done: int | None = None, total: int | None = None) -> tuple[bool, bool]:
        """Renew the lease (and write in-memory progress): (still held, cancel asked)."""
        now = utcnow()
        values: dict[str, Any] = {"lease_until": now + timedelta(seconds=self.lease_seconds), "updated_at": now}
        if done is not None:
            values["done"] = int(done)
        if total is not None:
            values["total"] = int(total)
        with self.db.write() as s:
            if not s.execute(update(_O).where(*self._mine(lease)).values(**values)).rowcount:
                return False, False
            return True, bool(s.execute(select(_O.c.cancel_requested).where(_O.c.id == lease.id)).scalar_one())

    def commit(self, s, lease: Lease, *, done: int, result: dict[str, Any], final: bool,
               receipts: list[tuple[int, str]] = (), applied_chunk: int | None = None) -> None:
        """Inside a write of the operation, before it commits: record its progress and result if this process still
        holds the lease and no cancel was asked; else ``Fenced`` (the whole transaction rolls back)."""
        now = utcnow()
        values: dict[str, Any] = {"done": int(done), "result": json.dumps(result), "updated_at": now}
        if final:
            values.update(status="succeeded", finished_at=now, lease_until=None)
        if not s.execute(update(_O).where(*self._mine(lease), _O.c.cancel_requested.is_(False))
                         .values(**values)).rowcount:
            raise Fenced(lease.id)
        if receipts:
            s.execute(insert(OperationReceipt.__table__),
                      [{"operation_id": lease.id, "idx": int(i), "receipt_id": rid} for i, rid in receipts])
        if applied_chunk is not None:
            payloads.drop_chunk(s, lease.id, applied_chunk)
        if final:
            payloads.shred(s, lease.id)
        lease.done, lease.result = int(done), result

    def end(self, lease: Lease, status: str, problem: str | None = None) -> bool:
        """Failed or cancelled, if still held: the request's key and chunks destroyed in the same transaction."""
        now = utcnow()
        with self.db.write() as s:
            ok = s.execute(update(_O).where(*self._mine(lease)).values(
                status=status, problem=problem, finished_at=now, updated_at=now, lease_until=None)).rowcount == 1
            if ok:
                payloads.shred(s, lease.id)
        if ok:
            self.db.scrub_wal()
        return ok

    def release(self, lease: Lease) -> bool:
        """Give the operation back (this process is stopping): queued again, for any process, at once; the attempt
        is not counted."""
        with self.db.write() as s:
            return s.execute(update(_O).where(*self._mine(lease)).values(
                status="queued", fence=None, owner=None, lease_until=None, attempts=_O.c.attempts - 1,
                updated_at=utcnow())).rowcount == 1

    def cancel_asked(self, lease: Lease) -> bool:
        with self.db.read() as s:
            return bool(s.execute(select(_O.c.cancel_requested).where(_O.c.id == lease.id)).scalar())

    def chunk(self, lease: Lease, seq: int) -> dict | None:
        """Chunk ``seq`` of the operation's sealed request (None once applied)."""
        with self.db.read() as s:
            wrapped = s.execute(select(_O.c.wrapped_key).where(_O.c.id == lease.id)).scalar()
            return payloads.read_chunk(s, lease.id, payloads.open_data_key(self.cipher, lease.id, wrapped), seq)

    def chunk_count(self, lease: Lease) -> int:
        from ..db.tables import OperationPayload

        with self.db.read() as s:
            last = s.execute(select(func.max(OperationPayload.seq)).where(
                OperationPayload.operation_id == lease.id)).scalar()
        return 0 if last is None else int(last) + 1
