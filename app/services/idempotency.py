"""Idempotency-Key for state-changing POSTs (API.md; draft-ietf-httpapi-idempotency-key-header).

- first request: a row (tenant, key) is claimed as in_progress in its own short transaction; the operation's
  own transaction stores the answer in that row before it commits, so an answered request is always
  replayable and a crashed one leaves only a stale claim;
- retry with the same key and the same request: the stored answer, nothing changes (no second receipt, no
  budget spent twice);
- same key, different request: 422 idempotency-key-reused;
- same key while the first is still running: 409; a claim older than ``stale_after`` seconds (its request
  died) is taken over;
- fencing (issue 29 item 8): every claim carries a random token, and a take-over draws a new one.  Completing a claim
  is a conditional update on its own token, in the operation's transaction: a request whose claim was taken over
  (it ran longer than ``stale_after``) finds no row to complete, raises, and its whole transaction -- the model
  write with it -- rolls back.  So one key is applied at most once, whatever the stale age; the request that lost
  its claim answers 409 ``idempotency-request-in-progress`` and the retry that took it over gives the answer.

No unkeyed trace of a record (issue 37, F5-C):

- the fingerprint stored is HMAC-SHA256 under the tenant's fingerprint key (records.fingerprint_key, derived from its
  sealed record key) of the SHA-256 of method, path and body: a database reader without the key cannot confirm a
  guessed body (it was the bare SHA-256, so 32 guesses recovered a forgotten record's features and label);
- an unlearn's fingerprint leaves out the features a client resends (``examples``: checked against the learned
  MAC, never kept), so it is a keyed function of the ids only, as the receipts' commitments are;
- a learn's row names its model and steps; when one of those records is forgotten (or the model deleted), the
  forget's transaction erases the row's fingerprint (``ERASED``, ``erase_learned`` / ``erase_model``; the stream
  events' too): a retry with that key then gets the stored answer (steps and version, no record data) without a
  body check;
- rows expire: a row older than ``retention`` seconds (OLU_IDEMPOTENCY_RETENTION_SECONDS) counts as absent and is
  deleted, by a purge each process runs at most once a minute while it serves keyed requests.
"""
from __future__ import annotations

import bisect
import hashlib
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Sequence

import orjson
from sqlalchemy import and_, delete, select, update
from sqlalchemy.exc import IntegrityError

from ..db.session import Database
from ..db.tables import IdempotencyRecord, StreamEvent
from ..errors import Problem
from ..ids import utcnow
from .records import fingerprint_key, keyed_fingerprint

MAX_KEY_LENGTH = 255
# 1 to 255 visible ASCII characters, spaces allowed inside but not at either end: HTTP strips a header value's
# surrounding whitespace (RFC 9110 §5.5), so such a key could not arrive as sent.  The OpenAPI document states this
# pattern on the header (app/api/models.py); a key that does not match is 422 and changes nothing.
KEY_PATTERN = rf"^[!-~](?:[ -~]{{0,{MAX_KEY_LENGTH - 2}}}[!-~])?$"
_KEY = re.compile(KEY_PATTERN)


@dataclass
class Replay:
    status_code: int
    body: bytes


ERASED = ""  # the fingerprint of a row whose records were forgotten: a retry replays the answer, unchecked
PURGE_EVERY = 60.0  # seconds between two purges of expired rows in one process


def fingerprint(method: str, path: str, body: bytes) -> bytes:
    """SHA-256 of a request (kept in memory only: the journal stores its keyed form, ``keyed_fingerprint``)."""
    return hashlib.sha256(method.encode() + b" " + path.encode() + b"\n" + body).digest()


class IdempotencyGuard:
    """One request's claim on a key.  ``complete`` runs inside the operation's transaction."""

    def __init__(self, store: "IdempotencyStore", tenant_id: str, key: str, claim: str, model_id: str | None = None):
        self.store, self.tenant_id, self.key, self.claim = store, tenant_id, key, claim
        self.model_id = model_id  # the model the request's path names (a learn's row is found by its records)
        self.status_code = 200
        self.encode = lambda payload: orjson.dumps(payload)  # the API sets the response model's encoder

    def _mine(self):
        return (IdempotencyRecord.tenant_id == self.tenant_id, IdempotencyRecord.key == self.key,
                IdempotencyRecord.state == "in_progress", IdempotencyRecord.claim == self.claim)

    def complete(self, s, payload) -> None:
        """Store the answer in the operation's transaction, if this request still holds the claim; else raise, so
        that the transaction (the operation's write with it) rolls back."""
        values = {"state": "done", "status_code": self.status_code, "response": self.encode(payload)}
        if self.model_id is not None and isinstance(payload, dict) and "first_step" in payload:
            # a learn: the steps of the records its body carried, so that forgetting one erases the fingerprint
            values.update(model_id=self.model_id, first_step=int(payload["first_step"]),
                          last_step=int(payload["last_step"]))
        done = s.execute(update(IdempotencyRecord).where(*self._mine()).values(**values))
        if done.rowcount != 1:
            raise Problem(409, "idempotency-request-in-progress",
                          "A retry with this Idempotency-Key took this request over (it ran longer than "
                          "OLU_IDEMPOTENCY_STALE_SECONDS); nothing of this attempt was applied. Retry with the same "
                          "key for the answer.")

    def release(self) -> None:
        """The request failed: drop the claim (if still ours) so that a corrected retry can run."""
        with self.store.db.write() as s:
            s.execute(delete(IdempotencyRecord).where(*self._mine()))


class IdempotencyStore:
    """``open_key(session, tenant_id)``: the tenant's record key (TenantService.record_key); the fingerprint key is
    derived from it and kept per process."""

    def __init__(self, db: Database, stale_after: float = 300.0, retention: float = 86_400.0,
                 open_key: Callable | None = None, clock: Callable[[], float] = time.monotonic):
        self.db, self.stale_after, self.retention = db, stale_after, float(retention)
        self.open_key, self.clock = open_key, clock
        self._keys: dict[str, bytes] = {}
        self._next_purge = 0.0
        self._purge_lock = threading.Lock()

    def _keyed(self, tenant_id: str, digest: bytes) -> str:
        key = self._keys.get(tenant_id)
        if key is None:
            if self.open_key is None:
                raise RuntimeError("IdempotencyStore needs open_key to fingerprint requests")
            with self.db.read() as s:
                key = fingerprint_key(self.open_key(s, tenant_id))
            if len(self._keys) >= 10_000:
                self._keys.clear()
            self._keys[tenant_id] = key
        return keyed_fingerprint(key, digest)

    def purge(self) -> int:
        """Delete the rows older than the retention window (answered or not); how many."""
        cutoff = utcnow() - timedelta(seconds=self.retention)
        with self.db.write() as s:
            return s.execute(delete(IdempotencyRecord).where(IdempotencyRecord.created_at < cutoff)).rowcount or 0

    def _maybe_purge(self) -> None:
        now = self.clock()
        if now < self._next_purge or not self._purge_lock.acquire(blocking=False):
            return
        try:
            self._next_purge = now + PURGE_EVERY
            self.purge()
        finally:
            self._purge_lock.release()

    def begin(self, tenant_id: str, key: str, digest: bytes, model_id: str | None = None) -> IdempotencyGuard | Replay:
        """Claim ``key`` for the request whose ``fingerprint`` is ``digest`` (a learn names its ``model_id``)."""
        if not _KEY.fullmatch(key):
            raise Problem(422, "validation-error", f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} visible ASCII "
                          "characters (spaces only inside).")
        self._maybe_purge()
        request_hash = self._keyed(tenant_id, digest)
        for _ in range(3):  # a take-over that loses a race reads the row again
            guard = self._claim(tenant_id, key, request_hash, model_id)
            if guard is not None:
                return guard
        raise Problem(409, "idempotency-request-in-progress",
                      "A request with this Idempotency-Key is still being processed; retry later.")

    def _claim(self, tenant_id: str, key: str, request_hash: str,
               model_id: str | None) -> IdempotencyGuard | Replay | None:
        now, token = utcnow(), secrets.token_hex(16)
        try:
            with self.db.write() as s:
                s.add(IdempotencyRecord(tenant_id=tenant_id, key=key, request_hash=request_hash, state="in_progress",
                                        created_at=now, claim=token))
            return IdempotencyGuard(self, tenant_id, key, token, model_id)
        except IntegrityError:
            pass
        with self.db.write() as s:
            row = s.scalars(select(IdempotencyRecord).where(IdempotencyRecord.tenant_id == tenant_id,
                                                            IdempotencyRecord.key == key)).first()
            created = None if row is None else (
                row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=now.tzinfo))
            if row is not None and now - created >= timedelta(seconds=self.retention):
                s.delete(row)  # past the retention window: the key is free again
                s.flush()
                row = None
            if row is None:  # released (or expired) meanwhile: claim it
                s.add(IdempotencyRecord(tenant_id=tenant_id, key=key, request_hash=request_hash,
                                        state="in_progress", created_at=now, claim=token))
                return IdempotencyGuard(self, tenant_id, key, token, model_id)
            if row.request_hash not in (request_hash, ERASED):
                raise Problem(422, "idempotency-key-reused",
                              "This Idempotency-Key was used with a different request.")
            if row.state == "done":
                return Replay(row.status_code or 200, row.response or b"null")
            if now - created < timedelta(seconds=self.stale_after):
                raise Problem(409, "idempotency-request-in-progress",
                              "A request with this Idempotency-Key is still being processed; retry later.")
            # the first attempt is presumed dead: take over with a new token, only if nobody completed or took
            # it over since the read (the old token fences the update)
            held = IdempotencyRecord.claim.is_(None) if row.claim is None else IdempotencyRecord.claim == row.claim
            taken = s.execute(update(IdempotencyRecord)
                              .where(IdempotencyRecord.tenant_id == tenant_id, IdempotencyRecord.key == key,
                                     IdempotencyRecord.state == "in_progress", held)
                              .values(created_at=now, claim=token)
                              .execution_options(synchronize_session=False))
            return IdempotencyGuard(self, tenant_id, key, token, model_id) if taken.rowcount == 1 else None


# ---- erasing the fingerprints of forgotten records (in the forget's or the deletion's transaction) ----------------
_IDEM, _EVENTS = IdempotencyRecord.__table__, StreamEvent.__table__
_JOURNALS = ((_IDEM, _IDEM.c.key, _IDEM.c.request_hash), (_EVENTS, _EVENTS.c.event_id, _EVENTS.c.body_sha256))


def erase_learned(conn, tenant_id: str, model_id: str, steps: Sequence[int]) -> int:
    """Erase the fingerprint of every journal row (idempotency keys, stream events) of a learn of ``model_id`` whose
    records include one of ``steps`` (being forgotten); the rows are found by their step range, one index range
    scan per table.  How many rows."""
    if not len(steps):
        return 0
    ordered = sorted(int(t) for t in steps)
    lo, hi = ordered[0], ordered[-1]
    erased = 0
    for table, pk, column in _JOURNALS:
        hits = []
        for name, first, last in conn.execute(
                select(pk, table.c.first_step, table.c.last_step).where(
                    table.c.model_id == model_id, table.c.last_step >= lo, table.c.first_step <= hi,
                    table.c.tenant_id == tenant_id, column != ERASED)):
            at = bisect.bisect_left(ordered, int(first))
            if at < len(ordered) and ordered[at] <= int(last):
                hits.append(name)
        for i in range(0, len(hits), 500):
            erased += conn.execute(update(table).where(table.c.tenant_id == tenant_id, pk.in_(hits[i:i + 500]))
                                   .values({column.name: ERASED})).rowcount or 0
    return erased


def erase_model(conn, tenant_id: str, model_id: str) -> None:
    """A model's deletion: erase the fingerprints of every journal row of its learns."""
    for table, _, column in _JOURNALS:
        conn.execute(update(table).where(and_(table.c.tenant_id == tenant_id, table.c.model_id == model_id,
                                              table.c.first_step.is_not(None), column != ERASED))
                     .values({column.name: ERASED}))
