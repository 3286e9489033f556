"""Tenant and key administration (admin token)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from ..schemas import (NO_CONTROL, KeyCreate, KeyCreated, QuotaSet, TenantCreate, TenantCreated, TenantDeleted,
                       TenantView)
from .deps import Admin, AnyKey, get_ctx
from .problems import responses

router = APIRouter(prefix="/v1/tenants", tags=["admin"])
Id = Annotated[str, Path(pattern=NO_CONTROL)]


@router.post("", status_code=201, response_model=TenantCreated, responses=responses(401, 403, 422))
def create_tenant(body: TenantCreate, request: Request, _: Admin):
    """Create a tenant and its first API key (all scopes). The key is shown once."""
    return get_ctx(request).tenants.create_tenant(body.name)


@router.get("/{tenant_id}", response_model=TenantView, responses=responses(401, 403, 404))
def get_tenant(tenant_id: Id, request: Request, _: Admin):
    """The tenant with its quotas (in force, and its own settings) and its usage: live models, records held, bytes
    stored. A deleted tenant is shown too (deleted_at set; it holds nothing)."""
    ctx = get_ctx(request)
    return ctx.tenants.view(tenant_id, ctx.models.core.quotas)


@router.put("/{tenant_id}/quotas", response_model=TenantView, responses=responses(401, 403, 404, 422))
def set_quotas(tenant_id: Id, body: QuotaSet, request: Request, _: Admin):
    """Set the tenant's quotas of live models, records held and bytes stored (0: no limit; null or absent: the
    deployment's default, OLU_TENANT_MAX_MODELS / _RECORDS / _BYTES). A model creation or learn that would pass a
    quota is refused with 409 `quota-exceeded` (naming `quota`, `limit`, `usage`) and changes nothing; forgets,
    retrains and deletions are never refused and give quota back. Lowering a quota below the usage removes
    nothing. A deleted tenant is 404."""
    ctx = get_ctx(request)
    return ctx.tenants.set_quotas(tenant_id, body.model_dump(), ctx.models.core.quotas)


@router.delete("/{tenant_id}", response_model=TenantDeleted, responses=responses(401, 403, 404))
def delete_tenant(tenant_id: Id, request: Request, _: Admin):
    """Delete a tenant in one transaction: every live model is erased as by DELETE /v1/models/{id} (one signed
    erasure receipt each), every key is revoked, the tenant is marked deleted. Its signed log, receipts, ledgers
    and erased-record commitments stay for audit (an audit-only key may still be created). A deleted tenant is 404."""
    ctx = get_ctx(request)
    return ctx.tenants.delete_tenant(tenant_id, ctx.models.lifecycle)


@router.post("/{tenant_id}/keys", status_code=201, response_model=KeyCreated, responses=responses(401, 403, 404, 409, 422))
def create_key(tenant_id: Id, body: KeyCreate, request: Request, _: Admin):
    """Create an API key with the given scopes. The key is shown once. A deleted tenant gets audit-only keys."""
    return get_ctx(request).tenants.create_key(tenant_id, list(body.scopes), body.label)


@router.delete("/{tenant_id}/keys/{key_id}", status_code=204, response_class=Response,
               responses=responses(401, 403, 404))
def revoke_key(tenant_id: Id, key_id: Id, request: Request, _: Admin):
    """Revoke a key at once."""
    get_ctx(request).tenants.revoke_key(tenant_id, key_id)
    return Response(status_code=204)


own = APIRouter(prefix="/v1/tenant", tags=["tenant"])


@own.get("", response_model=TenantView, responses=responses(401, 403))
def get_own_tenant(request: Request, p: AnyKey):
    """The caller's own tenant (any key): its quotas and its usage (live models, records held, bytes stored)."""
    ctx = get_ctx(request)
    return ctx.tenants.view(p.tenant_id, ctx.models.core.quotas)
