"""Run a state-changing operation under the request's Idempotency-Key, if it has one; answer pre-serialised JSON."""
from __future__ import annotations

from typing import Any, Callable

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from ..services.idempotency import Replay, fingerprint
from .deps import get_ctx

HEADER = "idempotency-key"
JSON = "application/json"


def encode(response_model: type[BaseModel], payload: Any) -> bytes:
    """``payload`` validated against ``response_model`` and serialised: the bytes of the answer and of its replays."""
    return response_model.model_validate(payload).model_dump_json().encode()


def json_response(response_model: type[BaseModel], payload: Any, status_code: int = 200) -> Response:
    """A ready Response (FastAPI then skips its own response-model pass; the decorator still documents it)."""
    return Response(encode(response_model, payload), status_code=status_code, media_type=JSON)


def request_fingerprint(method: str, path: str, body: BaseModel | None) -> bytes:
    """The SHA-256 a request's Idempotency-Key row is keyed from: method, path and the canonical body, less what the
    body's model leaves out (``UNFINGERPRINTED``: the features a client resends to forget are checked, never kept)."""
    kept = b"" if body is None else body.model_dump_json(exclude=getattr(body, "UNFINGERPRINTED", None)).encode()
    return fingerprint(method, path, kept)


def run(request: Request, tenant_id: str, body: BaseModel | None, response_model: type[BaseModel], status_code: int,
        operation: Callable) -> Response:
    """``operation(guard)`` performs the write; with a key its answer is stored in the same transaction.

    Blocking (database): call it from a worker thread."""
    key = request.headers.get(HEADER)
    if key is None:
        return json_response(response_model, operation(None), status_code)
    store = get_ctx(request).idempotency
    claim = store.begin(tenant_id, key, request_fingerprint(request.method, request.url.path, body),
                        request.path_params.get("model_id"))
    if isinstance(claim, Replay):
        return Response(claim.body, status_code=claim.status_code, media_type=JSON,
                        headers={"idempotent-replayed": "true"})
    claim.status_code = status_code
    stored: list = []  # (payload, bytes) as stored with the answer: sent as is

    def encode_stored(payload):
        raw = encode(response_model, payload)
        stored[:] = [payload, raw]
        return raw

    claim.encode = encode_stored
    try:
        payload = operation(claim)
    except BaseException:
        claim.release()
        raise
    raw = stored[1] if stored and stored[0] is payload else encode(response_model, payload)
    return Response(raw, status_code=status_code, media_type=JSON)
