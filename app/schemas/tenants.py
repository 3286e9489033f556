"""Tenants, their API keys and the public signing keys.  Field names are part of the contract (API.md)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


from .common import (UtcDatetime, NO_CONTROL, Scope, Strict)
from .rules import json_int


# ---- tenants and keys ---------------------------------------------------------------------------------
class TenantCreate(Strict):
    name: str = Field(min_length=1, max_length=200, pattern=NO_CONTROL)


class ModelErasedRef(BaseModel):
    model_id: str
    erasure_receipt_id: str


class TenantDeleted(BaseModel):
    """What DELETE /v1/tenants/{id} did: every live model erased (one erasure receipt each), every key revoked."""

    tenant_id: str
    deleted_at: UtcDatetime
    models_erased: list[ModelErasedRef]
    keys_revoked: int


class TenantCreated(BaseModel):
    id: str
    name: str
    api_key: str = Field(description="Shown once; carries the write, predict and audit scopes.")


MAX_QUOTA = 2**53 - 1


class QuotaSet(Strict):
    """A tenant's own quotas (PUT /v1/tenants/{id}/quotas): each replaces the deployment's default for it."""

    # At most 2**53 - 1, JavaScript's largest safe integer, exact as a double, as is every integer below it. The bound
    # was 2**62, which the OpenAPI document states as a double: a client comparing in doubles took 2**62 + 95 for
    # 2**62, valid, and the service refused it (schemathesis ST202 in CI)
    # json_int: an integer or an integral float as JSON Schema's "integer" has it, never a boolean (true read as 1)
    models: json_int(ge=0, le=MAX_QUOTA) | None = Field(None, description=(
        "Live models; 0: no limit; null or absent: the deployment's default (OLU_TENANT_MAX_MODELS)."))
    records: json_int(ge=0, le=MAX_QUOTA) | None = Field(None, description=(
        "Records held (learned, not forgotten); 0: no limit; null or absent: OLU_TENANT_MAX_RECORDS."))
    bytes: json_int(ge=0, le=MAX_QUOTA) | None = Field(None, description=(
        "Bytes stored (states, records, retained examples, estimated from the byte lengths written); 0: no limit; "
        "null or absent: OLU_TENANT_MAX_BYTES."))
    audit_bytes: json_int(ge=0, le=MAX_QUOTA) | None = Field(None, description=(
        "Bytes of the audit trail (receipts, log, forgotten and erased records' commitments, ledger entries, "
        "checkpoints, deleted models' rows), which nothing frees: once used up, learns and model creations are "
        "refused, never forgets or deletions; 0: no limit; null or absent: OLU_TENANT_MAX_AUDIT_BYTES."))


class QuotaNumbers(BaseModel):
    models: int
    records: int
    bytes: int
    audit_bytes: int


class QuotaOverrides(BaseModel):
    models: int | None
    records: int | None
    bytes: int | None
    audit_bytes: int | None


class Usage(BaseModel):
    models: int = Field(description="Live models.")
    records: int = Field(description="Records held: learned and not forgotten, over the live models.")
    bytes: int = Field(description="Bytes stored by the live models: sealed states, per record held its index "
                                   "entry (and example MAC), and the sealed retained examples with their wrapped "
                                   "keys, from the byte lengths written (database overhead not counted).")
    audit_bytes: int = Field(description="Bytes of the audit trail the tenant's forgets, model deletions and "
                                         "checkpoints left (receipts, log nodes, commitments, ledger entries, deleted "
                                         "models' rows), from the byte lengths written; it only grows.")


class TenantView(BaseModel):
    """A tenant with its quotas and what it uses of them."""

    id: str
    name: str
    created_at: UtcDatetime
    deleted_at: UtcDatetime | None = None
    quotas: QuotaNumbers = Field(description="The quotas in force (0: no limit, as everywhere quotas are given).")
    quota_overrides: QuotaOverrides = Field(description="The tenant's own quotas set by the admin (0: no limit; "
                                                        "null: the deployment's default applies).")
    usage: Usage


class KeyCreate(Strict):
    scopes: list[Scope] = Field(min_length=1, max_length=3)
    label: str | None = Field(None, max_length=200, pattern=NO_CONTROL)


class KeyCreated(BaseModel):
    id: str
    api_key: str = Field(description="Shown once.")
    scopes: list[Scope]
    label: str | None = None


class PublicKey(BaseModel):
    key_id: str
    alg: Literal["Ed25519"] = "Ed25519"
    public_key: str = Field(description="Base64 of the raw 32-byte Ed25519 public key.")
    status: str = "active"
    not_before: str | None = None
    not_after: str | None = None


class PublicKeys(BaseModel):
    keys: list[PublicKey]
