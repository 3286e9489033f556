"""The audit reads: ledger, deletion log, record status, consistency proofs, export bundles.  Field names are part of the contract (API.md)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


from .common import (UtcDatetime)
from .tenants import (PublicKey)
from .models import (LEDGER_DETAILS)
from .receipts import (SignedCheckpoint, Receipt, ErasureReceipt, DELETION_MARK_DOC)


class LedgerEntryOut(BaseModel):
    receipt_id: str | None
    kind: str
    step: int
    sigma: float
    rho: float


class Ledger(BaseModel):
    model_id: str
    epoch: int
    accounting: str
    rho_spent: float | None
    rho_budget: float | None
    epsilon: float
    delta: float | None
    conversion: str
    capacity_total: int | None
    capacity_left: int | None
    entries: list[LedgerEntryOut]
    details: dict[str, Any] = LEDGER_DETAILS
    model_status: Literal["live", "deleted"] = DELETION_MARK_DOC["model_status"]
    deleted_at: UtcDatetime | None = DELETION_MARK_DOC["deleted_at"]
    erasure_receipt_id: str | None = DELETION_MARK_DOC["erasure_receipt_id"]


class ReceiptList(BaseModel):
    items: list[Receipt]
    next_cursor: str | None


class DeletionLog(ReceiptList):
    """A model's certificate receipts (its erasure receipt, if deleted, is named, not listed)."""

    model_status: Literal["live", "deleted"] = DELETION_MARK_DOC["model_status"]
    deleted_at: UtcDatetime | None = DELETION_MARK_DOC["deleted_at"]
    erasure_receipt_id: str | None = DELETION_MARK_DOC["erasure_receipt_id"]


class RecordModelStatus(BaseModel):
    model_id: str
    status: Literal["learned", "forgotten", "erased_with_model"] = Field(description=(
        "learned; forgotten (unlearned, receipt_id is its certificate receipt); or erased_with_model (the model "
        "was deleted while it held the record: receipt_id is the model's erasure receipt, erased_at its time)."))
    step: int | None = Field(description="The record's step; null where its receipt withholds it (a model private "
                                         "with respect to each record's presence).")
    receipt_id: str | None = None
    erased_at: UtcDatetime | None = Field(None, description="Only with erased_with_model: when the model was deleted.")


class RecordStatus(BaseModel):
    record_id: str
    models: list[RecordModelStatus]


class ConsistencyProof(BaseModel):
    from_size: int
    to_size: int
    hashes: list[str] = Field(description="RFC 9162 consistency proof, base64 hashes.")
    from_checkpoint: SignedCheckpoint
    to_checkpoint: SignedCheckpoint


class ErasureEvidence(BaseModel):
    receipt: ErasureReceipt
    commitments: list[str] | None = Field(None, description=(
        "In a model's bundle: the erased records' commitments (hex, sorted), whose count and SHA-256 the verifier "
        "checks against the receipt; null in a record's bundle."))


class ExportBundle(BaseModel):
    """Everything an auditor needs to verify offline: receipts with proofs, the checkpoint, the public keys."""

    receipts: list[Receipt]
    erasures: list[ErasureEvidence] = Field(default_factory=list, description=(
        "Erasure receipts of deleted models (the model exported, or those that erased the record exported)."))
    checkpoint: SignedCheckpoint
    public_keys: list[PublicKey]
    next_cursor: str | None = Field(None, description=(
        "With limit: the cursor of the next page (the same bundle, the same checkpoint); null on the last page."))
