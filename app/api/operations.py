"""Operations (issue 36 item 4; Google AIP-151): long work answered 202 Accepted, then polled.

A retrain, unlearn or learn whose work exceeds one request's budget -- or that sends ``Prefer: respond-async``
(RFC 7240) -- answers **202 Accepted** with ``Location: /v1/operations/{id}`` and the operation as its body
(app/services/operation_start.py decides and checks; app/services/operation_runner.py runs it).  The routes here read
(any key of the tenant), list, cancel (write scope) and page a bulk unlearn's receipts (write or audit scope); another
tenant's operation is 404.  ``start_*`` are called by the model routes (app/api/models.py).
"""
from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..errors import Problem
from ..ids import id_pattern
from ..schemas.common import NO_CONTROL
from ..schemas.operations import Operation, OperationList, OperationReceipts, problem_document
from ..services.auth import Principal
from . import idempotent
from .deps import AnyKey, Writer, authenticate, get_ctx
from .problems import TITLES, responses

router = APIRouter(prefix="/v1/operations", tags=["operations"])
OperationId = Annotated[str, Path(pattern=NO_CONTROL, max_length=64, description="An operation id (no control characters).")]
Limit = Annotated[int, Query(ge=1, le=200)]
STATUS = "^(queued|running|succeeded|failed|cancelled)$"
PreferHeader = Annotated[str | None, Header(alias="Prefer", max_length=1024, description=(
    "RFC 7240. `respond-async`: answer 202 Accepted with an operation even when the work fits one request; "
    "without it, only work over the request budget (OLU_MAX_REQUEST_WORK) is answered 202."))]
ACCEPTED = {202: {"model": Operation, "description": "Accepted: the work runs as an operation (its body); poll "
                                                     "`Location`.",
                  "headers": {"Location": {"description": "/v1/operations/{id}", "schema": {"type": "string"}},
                              "Preference-Applied": {"description": "respond-async, when the request asked for it.",
                                                     "schema": {"type": "string"}}}}}


def present(op: dict[str, Any]) -> dict[str, Any]:
    """The stored view with its problem rendered as RFC 9457."""
    return {**op, "error": problem_document(op["error"], TITLES)}


def prefers_async(request: Request) -> bool:
    """``Prefer: respond-async`` among the request's preferences (comma-separated, parameters after ``;``)."""
    for header in request.headers.getlist("prefer"):
        for pref in header.split(","):
            if pref.split(";", 1)[0].split("=", 1)[0].strip().lower() == "respond-async":
                return True
    return False


def _accepted(response: Response, asked: bool) -> Response:
    """Location (and Preference-Applied) on a 202, the first answer or an idempotent replay of it."""
    if response.status_code == 202:
        response.headers["Location"] = f"/v1/operations/{orjson.loads(response.body)['id']}"
        if asked:
            response.headers["Preference-Applied"] = "respond-async"
    return response


def start_retrain(request: Request, tenant_id: str, model_id: str) -> Response | None:
    """The retrain as an operation (202), or None: the request path retrains at once.  Blocking."""
    ctx, asked = get_ctx(request), prefers_async(request)
    starts = ctx.operation_starts
    if not asked and not starts.retrain_is_long(tenant_id, model_id):
        return None
    return _accepted(idempotent.run(request, tenant_id, None, Operation, 202,
                                    lambda guard: starts.retrain(tenant_id, model_id, guard)), asked)


def start_learn(request: Request, tenant_id: str, model_id: str, batch) -> Response | None:
    """A learn over the model's max_learn_batch (or asked) as an operation, else None.  Blocking."""
    ctx, asked = get_ctx(request), prefers_async(request)
    starts = ctx.operation_starts
    if not asked and not starts.learn_is_long(tenant_id, model_id, len(batch.ids)):
        return None
    return _accepted(idempotent.run(request, tenant_id, batch.model, Operation, 202, lambda guard: starts.learn(
        tenant_id, model_id, batch.ids, batch.X, batch.y, batch.F, guard)), asked)


def start_unlearn(request: Request, tenant_id: str, model_id: str, body, examples) -> Response | None:
    """An unlearn over the model's max_forget_batch (or asked) as an operation, else None.  Blocking: the caller
    runs it on a worker thread in the tenant's turn of the fair scheduler, with the rest of the request."""
    ctx, asked = get_ctx(request), prefers_async(request)
    starts = ctx.operation_starts
    if not asked and len(body.ids) <= 1:  # every model forgets one record per request
        return None
    if not asked and not starts.unlearn_is_long(tenant_id, model_id, len(body.ids)):
        return None
    return _accepted(idempotent.run(request, tenant_id, body, Operation, 202, lambda guard: starts.unlearn(
        tenant_id, model_id, list(body.ids), examples, guard)), asked)


async def _reader_of_receipts(request: Request) -> Principal:
    p = await authenticate(request)
    if p.is_admin:
        raise Problem(403, "forbidden", "The admin token manages tenants and keys only.")
    if not {"write", "audit"} & set(p.scopes):
        raise Problem(403, "forbidden", "This operation needs the 'write' or the 'audit' scope.")
    return p


@router.get("", response_model=OperationList, responses=responses(401, 403, 422))
def list_operations(request: Request, p: AnyKey,
                    model_id: Annotated[str | None, Query(pattern=NO_CONTROL, max_length=64)] = None,
                    status: Annotated[str | None, Query(pattern=STATUS)] = None,
                    cursor: Annotated[str | None, Query(pattern=id_pattern("op"))] = None, limit: Limit = 50):
    """The tenant's operations, newest first, with cursor pagination; optionally of one model, or in one status."""
    out = get_ctx(request).operations.list(p.tenant_id, model_id, status, cursor, limit)
    return {**out, "items": [present(op) for op in out["items"]]}


@router.get("/{operation_id}", response_model=Operation, responses=responses(401, 403, 404))
def get_operation(operation_id: OperationId, request: Request, p: AnyKey):
    """An operation: its status (queued, running, succeeded, failed, cancelled), progress `{done, total}`, times,
    the result of what it committed and, when it failed, its problem (RFC 9457). Another tenant's is 404."""
    return present(get_ctx(request).operations.get(p.tenant_id, operation_id))


@router.post("/{operation_id}/cancel", response_model=Operation, responses=responses(401, 403, 404))
def cancel_operation(operation_id: OperationId, request: Request, p: Writer):
    """Cancel an operation. A queued one is cancelled at once; a running one stops at its next checkpoint (within a
    page of records, or a second from another replica) and commits nothing more: what it applied before is what
    its `progress` and `result` say (a retrain applies nothing before it succeeds; a bulk unlearn or large learn
    keeps its committed batches). An ended operation is answered as it is. Answers the operation."""
    return present(get_ctx(request).operations.cancel(p.tenant_id, operation_id))


@router.get("/{operation_id}/receipts", response_model=OperationReceipts, responses=responses(401, 403, 404, 422))
def list_operation_receipts(operation_id: OperationId, request: Request,
                            p: Annotated[Principal, Depends(_reader_of_receipts)],
                            cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")] = None, limit: Limit = 50):
    """A bulk unlearn's signed receipts, one per record, in the order of the request's ids, for the batches
    committed so far (a record is never listed before its forget committed). Needs the write or audit scope."""
    return get_ctx(request).operations.receipts(p.tenant_id, operation_id, cursor, limit)
