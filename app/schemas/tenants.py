"""Tenants, their API keys and the public signing keys.  Field names are part of the contract (API.md)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


from .common import (UtcDatetime, NO_CONTROL, Scope, Strict)


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
