"""Broker events for ``olu consume``: the envelope, its decoding, and problem bodies for dead letters.

An event is one JetStream message on ``<prefix>.<tenant id>.<model id>.events`` whose payload is a JSON object
(or msgpack, with the header ``Content-Type: application/msgpack``)::

    {"id": "evt-42", "kind": "learn" | "unlearn", "model_id": "mdl_...", "body": {...}, "reply_to": "subject"}

``body`` is exactly the body of ``POST /v1/models/{id}/learn`` (either shape) or ``/unlearn``, validated by the same
code (``parse_learn_body``, ``UnlearnRequest``); ``model_id`` is optional and, when given, must name the model
of the subject; ``reply_to`` (optional) is where the result is published (else the consumer's receipts subject).
A per-event API key may come in the header ``Olu-Api-Key`` (else the worker's key applies).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ..api.learn_body import MSGPACK_TYPES, LearnBatch, parse_learn_body
from ..api.problems import PROBLEM_BASE, TITLES, _clean_errors
from ..errors import Problem
from ..schemas import UnlearnRequest

KINDS = ("learn", "unlearn")
KEY_HEADER = "Olu-Api-Key"
MAX_EVENT_ID = 255


def problem_body(status: int, slug: str, detail: str | None = None, **extra: Any) -> dict[str, Any]:
    """The RFC 9457 problem document the HTTP API would answer (app/api/problems.problem_response)."""
    body: dict[str, Any] = {"type": PROBLEM_BASE + slug,
                            "title": TITLES.get(slug, slug.replace("-", " ").capitalize()), "status": status}
    if detail:
        body["detail"] = detail
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def problem_of(exc: BaseException) -> dict[str, Any]:
    """A Problem or a request validation error as the problem body the HTTP API answers for it."""
    if isinstance(exc, Problem):
        return problem_body(exc.status, exc.slug, exc.detail, **exc.extra)
    if isinstance(exc, RequestValidationError):
        return problem_body(422, "validation-error", "The event body does not match the schema.",
                            errors=_clean_errors(list(exc.errors())))
    raise TypeError(type(exc))


def valid_subject(s: Any) -> bool:
    """A NATS subject one may publish to: dot-separated non-empty tokens, no wildcards or white space."""
    if not isinstance(s, str) or not s or len(s) > 255 or not s.isprintable():
        return False
    return all(t and t not in ("*", ">") and not any(c.isspace() for c in t) for t in s.split("."))


@dataclass
class Event:
    """One message taken from the stream, decoded as far as it goes."""
    msg: Any  # the nats-py message (ack / nak), None in unit tests
    stream: str
    seq: int
    subject: str
    model_id: str
    event_id: str
    # SHA-256 of the message as decoded; the Applier replaces it by its keyed form (``keyed``) before any comparison
    # or write: only HMAC-SHA256(tenant fingerprint key, this digest) is ever stored (issue 37, F5-C)
    body_sha256: str
    kind: str = "other"
    reply_to: str | None = None
    api_key: str | None = None
    learn: LearnBatch | None = None
    unlearn: UnlearnRequest | None = None
    problem: dict[str, Any] | None = None  # set when the event is to be dead-lettered
    redelivered: bool = False
    keyed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_examples(self) -> int:
        return len(self.learn.ids) if self.learn is not None else 0


def _decode(data: bytes, content_type: str | None) -> Any:
    if content_type and content_type.split(";")[0].strip().lower() in MSGPACK_TYPES:
        import msgpack

        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # NaN / Infinity literals decode, then fail the finiteness checks like HTTP


def _invalid(detail: str, loc: list[str], msg: str, type_: str) -> dict[str, Any]:
    """A 422 validation problem about the event envelope, with one error at ``event.<loc>``."""
    return problem_body(422, "validation-error", detail, errors=[{"loc": ["event", *loc], "msg": msg, "type": type_}])


def decode_event(data: bytes, headers: dict[str, str] | None, *, stream: str, seq: int, subject: str,
                 model_id: str, msg: Any = None, redelivered: bool = False) -> Event:
    """Decode one message into an Event; a malformed one comes back with ``problem`` set (never raises)."""
    headers = headers or {}
    ev = Event(msg=msg, stream=stream, seq=seq, subject=subject, model_id=model_id,
               event_id=f"{stream}:{seq}", body_sha256=hashlib.sha256(data or b"").hexdigest(),
               api_key=headers.get(KEY_HEADER), redelivered=redelivered)
    content_type = headers.get("Content-Type") or headers.get("content-type")
    try:
        env = _decode(data or b"", content_type)
    except Exception:  # noqa: BLE001 - any undecodable payload is the producer's
        ev.problem = _invalid("The event is not a JSON (or msgpack) object.", [], "decode error", "json_invalid")
        return ev
    if not isinstance(env, dict):
        ev.problem = _invalid("The event must be an object.", [], "Input should be an object", "dict_type")
        return ev
    eid = env.get("id")
    if isinstance(eid, str) and 0 < len(eid) <= MAX_EVENT_ID and eid.isprintable():
        ev.event_id = eid
    else:
        ev.problem = _invalid(f"The event needs an id: 1 to {MAX_EVENT_ID} printable characters.", ["id"],
                              "invalid event id", "string_type")
        return ev
    kind = env.get("kind")
    if kind not in KINDS:
        ev.problem = _invalid("kind must be 'learn' or 'unlearn'.", ["kind"], "Input should be 'learn' or 'unlearn'",
                              "literal_error")
        return ev
    ev.kind = kind
    reply = env.get("reply_to")
    if reply is not None:
        if not valid_subject(reply):
            ev.problem = _invalid("reply_to must be a NATS subject without wildcards.", ["reply_to"],
                                  "invalid subject", "value_error")
            return ev
        ev.reply_to = reply
    named = env.get("model_id")
    if named is not None and named != model_id:
        ev.problem = _invalid("model_id differs from the model of the subject.", ["model_id"],
                              "does not match the subject", "value_error")
        return ev
    body = env.get("body")
    try:
        if kind == "learn":
            # the HTTP endpoint's own decoder and checks, on the body bytes (msgpack kept msgpack: raw float64 x)
            if content_type and content_type.split(";")[0].strip().lower() in MSGPACK_TYPES:
                import msgpack

                ev.learn = parse_learn_body(msgpack.packb(body, use_bin_type=True), "application/msgpack")
            else:
                ev.learn = parse_learn_body(orjson.dumps(body) if body is not None else b"", "application/json")
        else:
            try:
                ev.unlearn = UnlearnRequest.model_validate(body)  # as FastAPI validates the /unlearn body
            except ValidationError as e:
                raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
    except (RequestValidationError, Problem) as e:
        ev.problem = problem_of(e)
    except (TypeError, ValueError):  # e.g. orjson refusing a non-string key
        ev.problem = problem_body(422, "validation-error", "The event body does not match the schema.")
    return ev
