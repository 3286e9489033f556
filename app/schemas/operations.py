"""Operations (long work answered 202 Accepted; AIP-151): the operation, its progress, result and error."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .common import UtcDatetime, _OmitNone
from .receipts import Receipt
from .writes import StepRange

OperationStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class Progress(BaseModel):
    done: int = Field(description="Units done: records read by a retrain (of those the model holds; it starts again "
                                  "from 0 if a take-over restarts it), records forgotten by a bulk unlearn, examples "
                                  "learned by a large learn (committed only).")
    total: int = Field(description="Units in all (records held, ids, examples).")


class OperationResult(_OmitNone):
    """What the operation committed (its last commit): a retrain's `version` and `epoch`; a bulk unlearn's
    `version`, `forgotten` and where its `receipts` are; a large learn's `accepted`, steps and `version`.  Present
    from the first commit, also when the operation failed or was cancelled after some batches."""

    _omit = ("epoch", "forgotten", "receipts", "accepted", "first_step", "last_step", "restart_on_forget")
    version: int | None = Field(None, description="The model's version after the operation's last commit.")
    epoch: int | None = Field(None, description="Retrain: the new ledger epoch.")
    forgotten: int | None = Field(None, description="Bulk unlearn: records forgotten so far, each with its receipt.")
    receipts: str | None = Field(None, description="Bulk unlearn: the path of its receipts, one per id in the order "
                                                   "of the request's ids (GET, paged).")
    accepted: int | None = Field(None, description="Large learn: examples learned so far.")
    first_step: int | None = None
    last_step: int | None = None
    restart_on_forget: StepRange | None = None


class OperationError(BaseModel):
    """The RFC 9457 problem the operation failed with (its members as a request's problem would carry them)."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str | None = None


class Operation(BaseModel):
    id: str = Field(description="The operation's id: GET /v1/operations/{id}.")
    kind: Literal["retrain", "unlearn", "learn"]
    model_id: str
    status: OperationStatus = Field(description="queued, running, then succeeded, failed or cancelled.")
    progress: Progress
    cancel_requested: bool = Field(description="A cancel was asked; the operation stops at its next checkpoint.")
    attempts: int = Field(description="Runs started: the first, and one per take-over after a process died.")
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    updated_at: UtcDatetime
    finished_at: UtcDatetime | None
    result: OperationResult | None = Field(description="What was committed (see OperationResult); null before.")
    error: OperationError | None = Field(description="Failed: the problem (RFC 9457); otherwise null.")


class OperationList(BaseModel):
    items: list[Operation]
    next_cursor: str | None


class OperationReceipts(BaseModel):
    """A bulk unlearn's receipts, in the order of the request's ids (a record another request forgot while the
    operation ran keeps the receipt it got then)."""

    items: list[Receipt]
    next_cursor: str | None


def problem_document(stored: dict[str, Any] | None, titles: dict[str, str]) -> dict[str, Any] | None:
    """A stored failure (status, slug, detail, members) as its RFC 9457 document."""
    if stored is None:
        return None
    stored = dict(stored)
    slug = stored.pop("slug")
    return {"type": f"/problems/{slug}", "title": titles.get(slug, slug.replace("-", " ").capitalize()), **stored}
