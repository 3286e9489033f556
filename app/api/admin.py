"""Tenant and key administration (admin token)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from ..schemas import NO_CONTROL, KeyCreate, KeyCreated, TenantCreate, TenantCreated, TenantDeleted
from .deps import Admin, get_ctx
from .problems import responses

router = APIRouter(prefix="/v1/tenants", tags=["admin"])
Id = Annotated[str, Path(pattern=NO_CONTROL)]


@router.post("", status_code=201, response_model=TenantCreated, responses=responses(401, 403, 422))
def create_tenant(body: TenantCreate, request: Request, _: Admin):
    """Create a tenant and its first API key (all scopes). The key is shown once."""
    return get_ctx(request).tenants.create_tenant(body.name)


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
