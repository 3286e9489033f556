"""Run a state-changing operation under the request's Idempotency-Key, if it has one."""
from __future__ import annotations

from typing import Callable

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from ..services.idempotency import Replay, fingerprint
from .deps import get_ctx

HEADER = "idempotency-key"


def run(request: Request, tenant_id: str, body: BaseModel | None, response_model: type[BaseModel], status_code: int,
        operation: Callable):
    """``operation(guard)`` performs the write; with a key its answer is stored in the same transaction."""
    key = request.headers.get(HEADER)
    if key is None:
        return operation(None)
    store = get_ctx(request).idempotency
    claim = store.begin(tenant_id, key, fingerprint(request.method, request.url.path,
                                                    body.model_dump_json().encode() if body is not None else b""))
    if isinstance(claim, Replay):
        return Response(claim.body, status_code=claim.status_code, media_type="application/json",
                        headers={"idempotent-replayed": "true"})
    claim.status_code = status_code
    claim.encode = lambda payload: orjson.dumps(response_model.model_validate(payload).model_dump(mode="json"))
    try:
        return operation(claim)
    except BaseException:
        claim.release()
        raise
