"""Audit reads: ledger, deletion log, receipts, record status (audit scope)."""
from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Iterator

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BeforeValidator, TypeAdapter

from ..schemas import (NO_CONTROL, ConsistencyProof, DeletionLog, ErasureReceipt, ExportBundle, Ledger, Receipt,
                           RecordStatus,
                           SignedCheckpoint)
from ..services.audit import EXPORT_CURSOR, EXPORT_MAX_PAGE, EXPORT_PAGE
from .deps import Auditor, get_ctx
from .problems import responses

router = APIRouter(prefix="/v1", tags=["audit"])
Limit = Annotated[int, Query(ge=1, le=200)]
ModelId = Annotated[str, Path(pattern=NO_CONTROL, description="A model id (no control characters).")]
# RFC 3339 §5.6 date-time, with its offset (pydantic alone would also take "0.5" as a Unix time, or a date)
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(value):
    if isinstance(value, str) and not _RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2026-01-31T12:00:00Z")
    return value


DateTime = Annotated[datetime | None, BeforeValidator(_rfc3339),
                     Query(description="An RFC 3339 date-time with an offset, e.g. 2026-01-31T12:00:00Z.")]


@router.get("/models/{model_id}/ledger", response_model=Ledger, responses=responses(401, 403, 404))
def get_ledger(model_id: ModelId, request: Request, p: Auditor):
    """The privacy ledger with every entry; also for deleted models (``model_status``, ``deleted_at``,
    ``erasure_receipt_id`` say so)."""
    return get_ctx(request).models.audit.ledger(p.tenant_id, model_id)


@router.get("/models/{model_id}/deletions", response_model=DeletionLog, responses=responses(401, 403, 404, 422))
def list_deletions(model_id: ModelId, request: Request, p: Auditor,
                   cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")] = None, limit: Limit = 50,
                   since: DateTime = None, until: DateTime = None):
    """The model's deletion receipts in log order, with cursor pagination and an optional issued-at window
    (``since`` inclusive, ``until`` exclusive); also for deleted models, whose erasure receipt is named in
    ``erasure_receipt_id``."""
    return get_ctx(request).models.audit.deletions(p.tenant_id, model_id, cursor, limit, since, until)


@router.get("/receipts/{receipt_id}", response_model=Receipt | ErasureReceipt, responses=responses(401, 403, 404))
def get_receipt(receipt_id: Annotated[str, Path(pattern=NO_CONTROL)], request: Request, p: Auditor):
    """A certificate receipt (an unlearned record) or an erasure receipt (a deleted model), with its proof."""
    return get_ctx(request).models.audit.receipt(p.tenant_id, receipt_id)


@router.get("/audit/records/{record_id}", response_model=RecordStatus, response_model_exclude_unset=True,
            responses=responses(401, 403, 404))
def get_record_status(record_id: Annotated[str, Path(max_length=256, pattern=NO_CONTROL)], request: Request, p: Auditor):
    """Where a client record id was learned and whether it was forgotten, or erased with a deleted model, across
    the tenant's models."""
    return get_ctx(request).models.audit.record_status(p.tenant_id, record_id)


@router.get("/audit/checkpoint", response_model=SignedCheckpoint, responses=responses(401, 403))
def get_checkpoint(request: Request, p: Auditor):
    """The signed checkpoint (tree size, root hash, time, key id) of the tenant's receipt log."""
    return get_ctx(request).models.audit.checkpoint(p.tenant_id)


@router.get("/audit/consistency", response_model=ConsistencyProof, responses=responses(401, 403, 422))
def get_consistency(request: Request, p: Auditor, from_size: Annotated[int, Query(ge=1)],
                    to_size: Annotated[int | None, Query(ge=1)] = None):
    """RFC 9162 consistency proof between two sizes of the tenant's log, with both signed checkpoints.

    `to_size` defaults to the log's size. Rules the schema cannot state: `from_size` <= `to_size` (422
    `validation-error`), and both at most the log's size (422 `log-size-exceeded`, with `log_size`)."""
    return get_ctx(request).models.audit.consistency(p.tenant_id, from_size, to_size)


@router.get("/audit/export", response_model=ExportBundle, responses=responses(401, 403, 404, 422))
def export_bundle(request: Request, p: Auditor,
                  record_id: Annotated[str | None, Query(max_length=256, pattern=NO_CONTROL)] = None,
                  model_id: Annotated[str | None, Query(pattern=NO_CONTROL)] = None,
                  cursor: Annotated[str | None, Query(pattern=EXPORT_CURSOR, description=(
                      "The next_cursor of the previous page: resumes the same bundle (same checkpoint).")
                  )] = None,
                  limit: Annotated[int | None, Query(ge=1, le=EXPORT_MAX_PAGE, description=(
                      "Receipts per page; absent: the whole bundle in one answer, streamed."))] = None):
    """An offline-verifiable bundle for one record (across the tenant's models) or one model's deletions.

    Give exactly one of `record_id` and `model_id` (422 `validation-error` otherwise: a rule across query
    parameters, which the schema cannot state).

    With `limit`, one page of at most `limit` receipts and a `next_cursor` (null on the last page): pass it as
    `cursor` to resume. Every page proves its receipts against the checkpoint the first page pinned, so the pages
    together are the bundle of the log at that size, each page verifiable on its own. Without `limit`, the whole
    bundle is answered at once (streamed page by page, `next_cursor` null). The erasure receipts come with the first
    page. A cursor names a log size and a log index (`<size>.<index>`): a size above the tenant's log is 422
    `log-size-exceeded` (with `log_size`); an index at or past the size is an empty last page."""
    audit = get_ctx(request).models.audit
    page = audit.export(p.tenant_id, record_id, model_id, cursor, limit or EXPORT_PAGE)
    if limit is not None or page["next_cursor"] is None:
        return page
    return StreamingResponse(_stream_bundle(audit, p.tenant_id, record_id, model_id, page),
                             media_type="application/json")


_RECEIPT = TypeAdapter(Receipt)
_BUNDLE_TAIL = TypeAdapter(ExportBundle)


def _stream_bundle(audit, tenant_id: str, record_id: str | None, model_id: str | None, first: dict) -> Iterator[bytes]:
    """The whole bundle as one JSON document, page by page (each page a short read; memory bounded by a page):
    the receipts of every page, then the first page's erasures, checkpoint and keys, as ``ExportBundle`` renders
    them."""
    yield b'{"receipts":['
    page, sep = first, b""
    while True:
        if page["receipts"]:  # one chunk per page: each chunk is a worker-thread hop and a send
            yield sep + b",".join(_RECEIPT.dump_json(_RECEIPT.validate_python(body)) for body in page["receipts"])
            sep = b","
        if page["next_cursor"] is None:
            break
        page = audit.export(tenant_id, record_id, model_id, page["next_cursor"], EXPORT_PAGE)
    tail = _BUNDLE_TAIL.dump_json(_BUNDLE_TAIL.validate_python({**first, "receipts": [], "next_cursor": None}))
    head = b'{"receipts":[],'
    assert tail.startswith(head)  # the receipts member first, as ExportBundle declares it
    yield b"]," + tail[len(head):]
