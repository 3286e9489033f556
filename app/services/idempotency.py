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
"""
from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta

import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from ..db.session import Database
from ..db.tables import IdempotencyRecord
from ..errors import Problem
from ..ids import utcnow

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


def fingerprint(method: str, path: str, body: bytes) -> str:
    return hashlib.sha256(method.encode() + b" " + path.encode() + b"\n" + body).hexdigest()


class IdempotencyGuard:
    """One request's claim on a key.  ``complete`` runs inside the operation's transaction."""

    def __init__(self, store: "IdempotencyStore", tenant_id: str, key: str, claim: str):
        self.store, self.tenant_id, self.key, self.claim = store, tenant_id, key, claim
        self.status_code = 200
        self.encode = lambda payload: orjson.dumps(payload)  # the API sets the response model's encoder

    def _mine(self):
        return (IdempotencyRecord.tenant_id == self.tenant_id, IdempotencyRecord.key == self.key,
                IdempotencyRecord.state == "in_progress", IdempotencyRecord.claim == self.claim)

    def complete(self, s, payload) -> None:
        """Store the answer in the operation's transaction, if this request still holds the claim; else raise, so
        that the transaction (the operation's write with it) rolls back."""
        done = s.execute(update(IdempotencyRecord).where(*self._mine())
                         .values(state="done", status_code=self.status_code, response=self.encode(payload)))
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
    def __init__(self, db: Database, stale_after: float = 300.0):
        self.db, self.stale_after = db, stale_after

    def begin(self, tenant_id: str, key: str, request_hash: str) -> IdempotencyGuard | Replay:
        if not _KEY.fullmatch(key):
            raise Problem(422, "validation-error", f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} visible ASCII "
                          "characters (spaces only inside).")
        for _ in range(3):  # a take-over that loses a race reads the row again
            guard = self._claim(tenant_id, key, request_hash)
            if guard is not None:
                return guard
        raise Problem(409, "idempotency-request-in-progress",
                      "A request with this Idempotency-Key is still being processed; retry later.")

    def _claim(self, tenant_id: str, key: str, request_hash: str) -> IdempotencyGuard | Replay | None:
        now, token = utcnow(), secrets.token_hex(16)
        try:
            with self.db.write() as s:
                s.add(IdempotencyRecord(tenant_id=tenant_id, key=key, request_hash=request_hash, state="in_progress",
                                        created_at=now, claim=token))
            return IdempotencyGuard(self, tenant_id, key, token)
        except IntegrityError:
            pass
        with self.db.write() as s:
            row = s.scalars(select(IdempotencyRecord).where(IdempotencyRecord.tenant_id == tenant_id,
                                                            IdempotencyRecord.key == key)).first()
            if row is None:  # released meanwhile: claim it
                s.add(IdempotencyRecord(tenant_id=tenant_id, key=key, request_hash=request_hash,
                                        state="in_progress", created_at=now, claim=token))
                return IdempotencyGuard(self, tenant_id, key, token)
            if row.request_hash != request_hash:
                raise Problem(422, "idempotency-key-reused",
                              "This Idempotency-Key was used with a different request.")
            if row.state == "done":
                return Replay(row.status_code or 200, row.response or b"null")
            created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=now.tzinfo)
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
            return IdempotencyGuard(self, tenant_id, key, token) if taken.rowcount == 1 else None
