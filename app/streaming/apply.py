"""The database side of ``olu consume``: apply a run of one model's events exactly once.

Each learn / unlearn runs through ``ModelService`` (the HTTP endpoints' own use cases: computed outside the
database's locks, written in one short transaction under the model's lock once its version is confirmed); the
``guard`` hook the Idempotency-Key path uses records, in that same transaction, every event id
the write applies (``stream_events``, with the message to publish back) and advances the model subject's cursor
(``stream_cursors``) from the sequence read before to the last sequence applied.  So an event is recorded exactly
when its effect is, and:

- a redelivered event (crash between commit and ack, or between commit and publish) finds its id recorded: it is
  acknowledged and its stored result re-published, nothing is applied twice;
- the cursor update is conditional (``WHERE last_seq = <read>``): two processes racing on one model cannot both
  commit, the loser rolls back and its messages are redelivered;
- a bad event is recorded as dead-lettered (with its problem) in its own transaction, and changes nothing else.

Consecutive learn events of a model are applied as one learn (one transaction); when that refuses, each is retried
alone so that only the bad one is dead-lettered.  A refusal that says "retry" (``RETRYABLE``: another writer kept
moving the model on, or the computation overran the request deadline) is not the event's fault: the rest of the
run is redelivered; a write conflict is redelivered however often it recurs, an event that overran the deadline
``MAX_DELIVER_ON_ERROR`` times is dead-lettered.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from sqlalchemy import insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from ..api.idempotent import encode
from ..api.problems import is_transient
from ..db.tables import StreamCursor, StreamEvent
from ..errors import Problem
from ..ids import utcnow
from ..schemas import UnlearnResponse
from ..services.idempotency import ERASED
from ..services.records import fingerprint_key, keyed_fingerprint
from .events import Event, problem_body

log = logging.getLogger("olu.stream")
_EVENTS = StreamEvent.__table__
_CURSORS = StreamCursor.__table__
MAX_DELIVER_ON_ERROR = 5  # an event failing with an unexpected error this many times is dead-lettered
RETRYABLE = frozenset({"write-conflict", "request-deadline-exceeded"})  # refusals that say "retry later"


def _redeliver(e: Problem, ev: "Event") -> bool:
    """Whether a refused event is redelivered rather than dead-lettered.

    ``write-conflict`` always: it says only that other writers (HTTP requests, other consumers) moved the model on
    while the event was computed, never that the event is bad, and the stream acknowledged the event to its
    producer.  Under sustained HTTP writes to the same model an event met it five deliveries running and was
    dead-lettered, an acknowledged write lost (tests/test_cluster.py, long profile: 5 of 4525 events).  A deadline
    overrun may be the event's own weight, so that one is dead-lettered after ``MAX_DELIVER_ON_ERROR`` deliveries."""
    if e.slug == "write-conflict":
        return True
    return e.slug in RETRYABLE and _num_delivered(ev) < MAX_DELIVER_ON_ERROR


class CursorMoved(Exception):
    """Another consumer took events of this model subject into account since the cursor was read."""


@dataclass
class Publication:
    subject: str
    payload: bytes
    headers: dict[str, str]


@dataclass
class Outcome:
    """What to do with one message once the transaction that concerns it has committed (or not)."""
    event: Event
    action: str  # ack | nak
    status: str  # applied | dead_letter | duplicate | retry
    publications: list[Publication] = field(default_factory=list)
    kind: str = "other"
    slug: str | None = None  # problem type of a dead letter


class Applier:
    def __init__(self, db, models, tenants, tenant_id: str, worker_key: str, *, max_batch: int,
                 results_subject: str, dead_letter_subject: str):
        self.db, self.models, self.tenants = db, models, tenants
        self.tenant_id, self.worker_key, self.max_batch = tenant_id, worker_key, max_batch
        self.results_subject, self.dead_letter_subject = results_subject, dead_letter_subject
        self._fp_key: bytes | None = None

    def _key_events(self, events: list[Event]) -> None:
        """Replace each event's SHA-256 by its keyed fingerprint (the only form compared and stored)."""
        if self._fp_key is None:
            with self.db.read() as s:
                self._fp_key = fingerprint_key(self.tenants.record_key(s, self.tenant_id))
        for ev in events:
            if not ev.keyed:
                ev.body_sha256 = keyed_fingerprint(self._fp_key, bytes.fromhex(ev.body_sha256))
                ev.keyed = True

    # ---- reads ---------------------------------------------------------------------------------------------
    def cursor(self, stream: str, subject: str) -> int | None:
        """The last sequence of ``subject`` taken into account, None before its first event."""
        with self.db.read_connection() as c:
            return c.execute(select(_CURSORS.c.last_seq).where(_CURSORS.c.stream == stream,
                                                               _CURSORS.c.subject == subject)).scalar_one_or_none()

    def recorded(self, event_ids: list[str]) -> dict[str, tuple[str, bytes, str]]:
        """event id -> (body sha256, published result, outcome) for the recorded ones among ``event_ids``."""
        out: dict[str, tuple[str, bytes, str]] = {}
        ids = sorted(set(event_ids))
        with self.db.read_connection() as c:
            for i in range(0, len(ids), 500):
                for eid, h, result, outcome in c.execute(
                        select(_EVENTS.c.event_id, _EVENTS.c.body_sha256, _EVENTS.c.result, _EVENTS.c.outcome).where(
                            _EVENTS.c.tenant_id == self.tenant_id, _EVENTS.c.event_id.in_(ids[i:i + 500]))):
                    out[eid] = (h, bytes(result), outcome)
        return out

    # ---- messages published back ---------------------------------------------------------------------------
    def _subject_for(self, ev: Event) -> str:
        return ev.reply_to or self.results_subject.format(tenant=self.tenant_id, model=ev.model_id)

    def _headers(self, ev: Event, outcome: str, replayed: bool = False) -> dict[str, str]:
        # Nats-Msg-Id: a stream that captures the results subject drops a re-publication (JetStream de-duplication)
        h = {"Nats-Msg-Id": f"olu:{self.tenant_id}:{ev.event_id}:{outcome}", "Olu-Event-Id": ev.event_id,
             "Olu-Outcome": outcome, "Content-Type": "application/json"}
        if replayed:
            h["Olu-Replayed"] = "true"
        return h

    def _dead_payload(self, ev: Event, problem: dict[str, Any]) -> bytes:
        return orjson.dumps({**problem, "instance": ev.subject, "event_id": ev.event_id, "kind": ev.kind,
                             "model_id": ev.model_id, "stream": ev.stream, "stream_seq": ev.seq})

    def _dead_publications(self, ev: Event, payload: bytes, replayed: bool = False) -> list[Publication]:
        pubs = [Publication(self.dead_letter_subject.format(tenant=self.tenant_id, model=ev.model_id), payload,
                            self._headers(ev, "dead_letter", replayed))]
        if ev.reply_to:  # the producer waiting on its reply subject learns of the refusal too
            pubs.append(Publication(ev.reply_to, payload, self._headers(ev, "dead_letter", replayed)))
        return pubs

    def _replay(self, ev: Event, result: bytes, outcome: str) -> Outcome:
        if outcome == "dead_letter":
            return Outcome(ev, "ack", "duplicate", self._dead_publications(ev, result, True), ev.kind)
        return Outcome(ev, "ack", "duplicate", [Publication(self._subject_for(ev), result,
                                                            self._headers(ev, "applied", True))], ev.kind)

    # ---- authorisation ---------------------------------------------------------------------------------------
    def _authorise(self, ev: Event) -> dict[str, Any] | None:
        """The problem of an event whose key may not write to this tenant's models (None: allowed)."""
        p = self.tenants.authenticate(ev.api_key or self.worker_key)
        if p is None:
            return problem_body(401, "unauthorized", "The event's API key is missing, revoked or invalid.")
        if p.tenant_id != self.tenant_id:
            return problem_body(403, "forbidden", "The event's API key belongs to another tenant.")
        if "write" not in p.scopes:
            return problem_body(403, "forbidden", "This operation needs the 'write' scope.")
        return None

    # ---- transactions ----------------------------------------------------------------------------------------
    def _advance(self, conn, ev: Event, old: int | None, new: int) -> None:
        if old is None:
            conn.execute(insert(_CURSORS).values(stream=ev.stream, subject=ev.subject, last_seq=new))
        else:
            r = conn.execute(update(_CURSORS).where(_CURSORS.c.stream == ev.stream, _CURSORS.c.subject == ev.subject,
                                                    _CURSORS.c.last_seq == old).values(last_seq=new))
            if r.rowcount != 1:
                raise CursorMoved(ev.subject)

    def _row(self, ev: Event, outcome: str, result: bytes, version: int | None, now,
             steps: tuple[int, int] | None = None, fingerprint: str | None = None) -> dict[str, Any]:
        """A stream_events row: ``steps`` (first, last) of an applied learn's records, so that forgetting one of them
        erases the fingerprint (services/idempotency.erase_learned); ``fingerprint`` overrides the event's."""
        return {"tenant_id": self.tenant_id, "event_id": ev.event_id, "model_id": ev.model_id[:255],
                "kind": ev.kind, "outcome": outcome, "stream": ev.stream, "seq": ev.seq,
                "body_sha256": ev.body_sha256 if fingerprint is None else fingerprint, "version": version,
                "result": result, "created_at": now, "first_step": None if steps is None else steps[0],
                "last_step": None if steps is None else steps[1]}

    def _record_dead(self, ev: Event, problem: dict[str, Any], cursor: int | None) -> Outcome:
        payload = self._dead_payload(ev, problem)
        stored = self._dead_payload(ev, redact_records(problem, _record_ids(ev)))
        with self.db.write() as s:
            conn = s.connection()
            conn.execute(insert(_EVENTS), [self._row(ev, "dead_letter", stored, None, utcnow())])
            self._advance(conn, ev, cursor, ev.seq)
        return Outcome(ev, "ack", "dead_letter", self._dead_publications(ev, payload), ev.kind,
                       problem["type"].rsplit("/", 1)[-1])

    def _skip(self, ev: Event, cursor: int | None) -> None:
        """Move the cursor past an event that is acknowledged without being recorded (a duplicate)."""
        with self.db.write() as s:
            self._advance(s.connection(), ev, cursor, ev.seq)

    def _apply_learn(self, chunk: list[Event], cursor: int | None) -> list[Outcome]:
        rec = _Recorder(self, chunk, cursor)
        ids = [rid for ev in chunk for rid in ev.learn.ids]
        if all(isinstance(ev.learn.X, np.ndarray) for ev in chunk):
            X = chunk[0].learn.X if len(chunk) == 1 else np.vstack([ev.learn.X for ev in chunk])
            y = chunk[0].learn.y if len(chunk) == 1 else np.concatenate([ev.learn.y for ev in chunk])
        else:
            X = [row for ev in chunk for row in (ev.learn.X.tolist() if isinstance(ev.learn.X, np.ndarray)
                                                 else ev.learn.X)]
            y = [v for ev in chunk for v in (ev.learn.y.tolist() if isinstance(ev.learn.y, np.ndarray)
                                             else ev.learn.y)]
        self.models.learning.learn(self.tenant_id, chunk[0].model_id, ids, X, y, rec)
        return rec.outcomes

    def _apply_unlearn(self, ev: Event, cursor: int | None) -> list[Outcome]:
        rec = _Recorder(self, [ev], cursor)
        body = ev.unlearn
        examples = [(e.id, e.x, e.y) for e in body.examples] if body.examples else None
        self.models.forgetting.unlearn(self.tenant_id, ev.model_id, list(body.ids), rec, examples)
        return rec.outcomes

    # ---- one model subject's run of events ------------------------------------------------------------------
    def apply_run(self, events: list[Event], cursor: int | None) -> list[Outcome]:
        """Take ``events`` (one model subject, in stream order, already cleared by the order check) into account.
        Every event gets an Outcome; after a retryable failure the rest of the run is 'nak' (redelivered later,
        in order)."""
        out: list[Outcome] = []
        self._key_events(events)
        known = self.recorded([ev.event_id for ev in events])
        i = 0
        while i < len(events):
            ev = events[i]
            try:
                if cursor is not None and ev.seq <= cursor:  # taken into account before: a redelivery
                    stored = known.get(ev.event_id)
                    if stored is not None and stored[0] in (ev.body_sha256, ERASED):
                        out.append(self._replay(ev, stored[1], stored[2]))
                    else:
                        out.append(self._reused(ev))
                    i += 1
                    continue
                stored = known.get(ev.event_id)
                if stored is not None:
                    self._skip(ev, cursor)
                    cursor = ev.seq
                    out.append(self._replay(ev, stored[1], stored[2]) if stored[0] in (ev.body_sha256, ERASED)
                               else self._reused(ev))
                    i += 1
                    continue
                problem = ev.problem or self._authorise(ev)
                if problem is not None:
                    out.append(self._record_dead(ev, problem, cursor))
                    self._remember(known, out[-1:])
                    cursor = ev.seq
                    i += 1
                    continue
                if ev.kind == "learn":
                    chunk, n, seen = [ev], ev.n_examples, {ev.event_id}
                    j = i + 1
                    while j < len(events):
                        nxt = events[j]
                        if (nxt.kind != "learn" or nxt.problem is not None or nxt.event_id in known
                                or nxt.event_id in seen or n + nxt.n_examples > self.max_batch
                                or nxt.seq <= (cursor or 0) or self._authorise(nxt) is not None):
                            break
                        chunk.append(nxt)
                        seen.add(nxt.event_id)
                        n += nxt.n_examples
                        j += 1
                    try:
                        done = self._apply_learn(chunk, cursor)
                    except Problem as e:
                        if len(chunk) == 1 or e.slug in RETRYABLE:
                            raise
                        log.info("batched learn of %d events refused (%s); applying them one by one", len(chunk),
                                 e.slug)
                        for one in chunk:  # only the bad event is dead-lettered
                            try:
                                done = self._apply_learn([one], cursor)
                            except Problem as e1:
                                if e1.slug in RETRYABLE:
                                    raise
                                done = [self._record_dead(one, problem_body(e1.status, e1.slug, e1.detail,
                                                                            **e1.extra), cursor)]
                            self._remember(known, done)
                            out += done
                            cursor = one.seq
                        i += len(chunk)
                        continue
                    self._remember(known, done)
                    out += done
                    cursor = chunk[-1].seq
                    i += len(chunk)
                else:
                    done = self._apply_unlearn(ev, cursor)
                    self._remember(known, done)
                    out += done
                    cursor = ev.seq
                    i += 1
            except Problem as e:  # a single event refused by the use case: dead letter, nothing changed
                if _redeliver(e, ev):
                    log.info("event %s refused with %s; redelivering", ev.event_id, e.slug)
                    break
                try:
                    out.append(self._record_dead(ev, problem_body(e.status, e.slug, e.detail, **e.extra), cursor))
                    self._remember(known, out[-1:])
                    cursor = ev.seq
                    i += 1
                except (CursorMoved, IntegrityError, DBAPIError) as e2:
                    log.info("dead letter of %s not recorded (%s); redelivering", ev.event_id, type(e2).__name__)
                    break
            except (CursorMoved, IntegrityError) as e:
                # another consumer moved this subject or recorded this id meanwhile: redeliver the rest, in order
                log.info("events of %s taken by another consumer (%s); redelivering", ev.subject, type(e).__name__)
                break
            except DBAPIError as e:
                log.warning("database error on %s (%s); redelivering", ev.subject,
                            "transient" if is_transient(e) else type(e.orig).__name__)
                break
            except Exception:  # noqa: BLE001 - a bug must not stop the consumer nor lose the event
                log.exception("unexpected error applying event %s", ev.event_id)
                delivered = _num_delivered(ev)
                if delivered >= MAX_DELIVER_ON_ERROR:
                    try:
                        out.append(self._record_dead(ev, problem_body(
                            500, "internal-error", f"The event failed {delivered} times; nothing was changed."),
                            cursor))
                        cursor = ev.seq
                        i += 1
                        continue
                    except Exception:  # noqa: BLE001
                        log.exception("dead letter of %s not recorded", ev.event_id)
                break
        out += [Outcome(ev, "nak", "retry", kind=ev.kind) for ev in events[len(out):]]  # one outcome per event
        return out

    @staticmethod
    def _remember(known: dict, done: list[Outcome]) -> None:
        for o in done:  # the same event id later in this run is a duplicate of this one
            known[o.event.event_id] = (o.event.body_sha256, o.publications[0].payload,
                                       "dead_letter" if o.status == "dead_letter" else "applied")

    def _reused(self, ev: Event) -> Outcome:
        problem = problem_body(409, "event-id-reused",
                               "This event id was already used with a different event; this one is not applied.")
        payload = self._dead_payload(ev, problem)
        return Outcome(ev, "ack", "dead_letter", self._dead_publications(ev, payload), ev.kind, "event-id-reused")


def _record_ids(ev: Event) -> list[str]:
    body = ev.learn if ev.learn is not None else ev.unlearn
    return list(getattr(body, "ids", None) or [])


def redact_records(problem: Any, ids: list[str]) -> Any:
    """``problem`` with every record id of the event replaced by ``<record i>`` (its place in the event), where it is
    a whole value (``record_ids``) or quoted in a text (``Record 'alice' was already forgotten``): what a dead letter
    keeps in stream_events (the problem published at the time names the ids; its stored copy, re-published on a
    redelivery, does not: no record id is ever written)."""
    if not ids:
        return problem
    place = {rid: f"<record {i}>" for i, rid in enumerate(ids)}

    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            if v in place:
                return place[v]
            for rid in sorted(place, key=len, reverse=True):
                if rid in v:
                    v = v.replace(repr(rid), place[rid]).replace(f'"{rid}"', place[rid])
            return v
        return v

    return walk(problem)


def _num_delivered(ev: Event) -> int:
    try:
        return int(ev.msg.metadata.num_delivered)
    except Exception:  # noqa: BLE001 - unit tests pass no message
        return 1


class _Recorder:
    """The ``guard`` given to ``ModelService.learn`` / ``unlearn``: ``complete`` runs inside their transaction,
    before commit, and records the events with the messages to publish back."""

    def __init__(self, applier: Applier, events: list[Event], cursor: int | None):
        self.applier, self.events, self.cursor = applier, events, cursor
        self.outcomes: list[Outcome] = []

    def complete(self, s, result: dict[str, Any]) -> None:
        a, now = self.applier, utcnow()
        rows, outcomes = [], []
        if "receipts" in result:  # unlearn: the HTTP answer, as the API serialises it
            (ev,) = self.events
            answer = orjson.loads(encode(UnlearnResponse, result))
            payload = orjson.dumps({"event_id": ev.event_id, "kind": "unlearn", "model_id": ev.model_id,
                                    "status": "applied", "stream_seq": ev.seq, **answer})
            # an unlearn that resent features keeps no function of them: its fingerprint is erased at once
            resent = ev.unlearn is not None and bool(ev.unlearn.examples)
            rows.append(a._row(ev, "applied", payload, result["version"], now, fingerprint=ERASED if resent else None))
            outcomes.append(Outcome(ev, "ack", "applied", [Publication(a._subject_for(ev), payload,
                                                                        a._headers(ev, "applied"))], "unlearn"))
        else:  # learn: a compact acknowledgement per event; the steps are consecutive (one per example)
            first = int(result["first_step"])
            for ev in self.events:
                n = ev.n_examples
                payload = orjson.dumps({"event_id": ev.event_id, "kind": "learn", "model_id": ev.model_id,
                                        "status": "applied", "stream_seq": ev.seq, "accepted": n,
                                        "first_step": first, "last_step": first + n - 1,
                                        "version": result["version"]})
                rows.append(a._row(ev, "applied", payload, result["version"], now, steps=(first, first + n - 1)))
                first += n
                outcomes.append(Outcome(ev, "ack", "applied", [Publication(a._subject_for(ev), payload,
                                                                            a._headers(ev, "applied"))], "learn"))
            if first - 1 != int(result["last_step"]):
                raise RuntimeError("learn steps are not consecutive")  # rolls back: never a wrong acknowledgement
        conn = s.connection()
        conn.execute(insert(_EVENTS), rows)
        a._advance(conn, self.events[-1], self.cursor, self.events[-1].seq)
        self.outcomes = outcomes
