"""Certificate receipts, erasure receipts and their proofs (docs/receipts.md).  Field names are part of the contract (API.md)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


from .common import (_OmitNone)


class Mechanism(_OmitNone):
    # a receipt is returned exactly as signed: grid/rounding/restart appear only where the signed body has them
    # (exact mechanisms and receipts issued before the discrete mechanism have neither)
    _omit = ("grid", "rounding", "restart", "shard", "from_slice", "records_replayed")
    type: str = Field(description="discrete_gaussian (discrete Gaussian noise on a grid, into the state) or exact "
                                  "(restart / retrain); receipts issued before the discrete mechanism say gaussian.")
    sigma: float
    sensitivity: float
    rho: float
    grid: float | None = Field(None, description="discrete_gaussian: the declared grid resolution g (a power of "
                                                 "two); the noised parameters are g times integers before any "
                                                 "projection onto the domain.")
    rounding: str | None = Field(None, description="discrete_gaussian: how the secret state was rounded onto the "
                                                   "grid (nearest_even: to nearest, ties to even).")
    restart: bool | None = Field(None, description="exact only, present (true) when this forget discarded the "
                                                   "model's whole learned state: it restarted from its initial state "
                                                   "(or, for a model that keeps its data, retrained from it on the "
                                                   "records it still holds) and a new ledger epoch began.  The "
                                                   "other records of the same request are forgotten by the same "
                                                   "restart.")
    shard: int | None = Field(None, description="exact forgets of a sharded model (sisa) only: the shard that held the "
                                                "record, recomputed without it.")
    from_slice: int | None = Field(None, description="sisa only: the slice of that shard from whose checkpoint the "
                                                     "recomputation started (0: from the start).")
    records_replayed: int | None = Field(None, description="sisa only: the retained records the recomputation "
                                                           "replayed (the work done; the retrain family replays "
                                                           "every record held).")


class ReceiptGuarantee(BaseModel):
    definition: str
    alpha: float | None
    epsilon: float
    delta: float | None
    conversion: str
    statement: str


class LedgerAfter(BaseModel):
    rho_spent: float
    epsilon: float
    delta: float | None
    capacity_left: int | None


class SignedCheckpoint(BaseModel):
    origin: str = Field(description="olu/<tenant_id>")
    tree_size: int
    root_hash: str = Field(description="Base64 of the RFC 6962 root hash.")
    timestamp: str
    key_id: str
    signature: str = Field(description="Ed25519 (base64) over '<origin>\\n<tree_size>\\n<root_hash>\\n<timestamp>\\n'.")


class ReceiptProof(BaseModel):
    leaf_index: int
    tree_size: int
    hashes: list[str] = Field(description="RFC 9162 audit path, leaf to root, base64.")
    checkpoint: SignedCheckpoint


class Receipt(BaseModel):
    id: str
    tenant_id: str
    model_id: str
    record_commitment: str
    learned_step: int | None = Field(description="The record's step; null (with forgotten_step and deletion_index) for "
                                                 "a model that withholds its record counts (exact_ridge with "
                                                 "publication private: a step counts the records learned).")
    forgotten_step: int | None
    deletion_index: int | None
    epoch: int
    algorithm: str
    mechanism: Mechanism
    guarantee: ReceiptGuarantee
    ledger_after: LedgerAfter
    published_parameters_sha256: str
    model_version: int
    issued_at: str
    log_index: int
    key_id: str
    signature: str = Field(description="Ed25519 over the RFC 8785 canonical JSON without signature and proof.")
    proof: ReceiptProof | None = Field(None, description="Inclusion proof against a signed checkpoint "
                                       "(on GET /v1/receipts/{id} and in export bundles).")


class ErasureGuarantee(BaseModel):
    definition: Literal["exact"]
    epsilon: float = Field(description="0: an exact forget spends no privacy budget.")
    delta: float
    statement: str


class ErasedRecords(BaseModel):
    erased: int = Field(description="How many records the model still held (learned and not forgotten before).")
    commitments_sha256: str = Field(description=(
        "Hex SHA-256 over the erased records' 32-byte commitments (HMAC-SHA256(tenant record key, record id)), "
        "sorted ascending as byte strings and concatenated; SHA-256 of the empty string when none."))


class ErasureReceipt(BaseModel):
    """The signed receipt of a model's deletion: one leaf of the tenant's log, like a certificate receipt."""

    id: str
    kind: Literal["model_erasure"]
    tenant_id: str
    model_id: str
    algorithm: str
    mechanism: Mechanism = Field(description="exact, sigma = sensitivity = rho = 0.")
    guarantee: ErasureGuarantee
    records: ErasedRecords
    records_learned: int = Field(description="Records the model ever learned.")
    records_forgotten_before: int = Field(description="Records forgotten earlier, each with its own receipt.")
    model_version: int = Field(description="The model's version after the deletion.")
    issued_at: str
    log_index: int
    key_id: str
    signature: str = Field(description="Ed25519 over the RFC 8785 canonical JSON without signature and proof.")
    proof: ReceiptProof | None = Field(None, description="Inclusion proof against a signed checkpoint "
                                       "(on GET /v1/receipts/{id} and in export bundles).")


DELETION_MARK_DOC = {
    "model_status": Field(description="live, or deleted (the model is erased; its audit trail stays readable)."),
    "deleted_at": Field(None, description="When the model was deleted."),
    "erasure_receipt_id": Field(None, description="The receipt of the model's deletion (GET /v1/receipts/{id})."),
}
