"""Request dependencies: authentication, scopes, the application context."""
from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from ..errors import Problem
from ..services.auth import Principal

SCOPES = ("write", "predict", "audit")


def get_ctx(request: Request):
    return request.app.state.ctx


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "unauthorized", "Send 'Authorization: Bearer <token>'.")
    return token.strip()


async def authenticate(request: Request) -> Principal:
    """Async: a cached key is checked on the event loop; only a database lookup goes to a worker thread.

    A token that is neither the admin token nor a live key counts as a failure of the client's address and of the
    token; once either has failed too often lately the failure is answered 429 instead of 401, and a token that
    has is refused before it is looked up.  A valid key is always let through, whatever its address did
    (app/api/ratelimit.py)."""
    token = _bearer(request)
    ctx = get_ctx(request)
    throttle = ctx.auth_failures
    if throttle is not None:
        retry_after = throttle.token_retry_after(token)
        if retry_after:
            raise _throttled("this token", retry_after)
    admin = ctx.settings.admin_token
    if admin is not None and hmac.compare_digest(token.encode(), admin.get_secret_value().encode()):
        return Principal(None, frozenset(), None, is_admin=True)
    principal = ctx.tenants.cached_principal(token)
    if principal is None:
        principal = await run_in_threadpool(ctx.tenants.authenticate, token)
    if principal is None:
        if throttle is not None:
            retry_after = throttle.failed(request.client.host if request.client else None, token)
            if retry_after:
                raise _throttled("this address or token", retry_after)
        raise Problem(401, "unauthorized", "Unknown or revoked key.")
    await _tenant_limits(request, ctx, principal.tenant_id)
    return principal


async def _tenant_limits(request: Request, ctx, tenant_id: str) -> None:
    """Remember the key's tenant for the middleware's tenant limits (app/api/fairness.py); a request the middleware
    could not attribute (the key's first, or first in a while) is admitted here, after authentication."""
    state = request.scope.get("olu.tenant_limits")
    limiter = getattr(ctx, "tenant_limits", None)
    if state is None or limiter is None:
        return
    limiter.attribute(state["digest"], tenant_id)
    if state["tenant"] is None:
        refusal = await limiter.admit_async(tenant_id)
        if refusal is not None:
            raise Problem(429, "rate-limited", refusal.detail, headers={"Retry-After": str(refusal.retry_after)},
                          limit=refusal.limit, retry_after=refusal.retry_after)
        state["tenant"] = tenant_id


def _throttled(what: str, retry_after: int) -> Problem:
    return Problem(429, "rate-limited", f"Too many failed authentications from {what}; the token is unknown or "
                   f"revoked; retry after {retry_after} s.", headers={"Retry-After": str(retry_after)})


async def require_admin(request: Request) -> Principal:
    p = await authenticate(request)
    if not p.is_admin:
        raise Problem(403, "forbidden", "This operation needs the admin token.")
    return p


def require(scope: str | None):
    """A tenant key with ``scope`` (None: any tenant key)."""

    async def dep(request: Request) -> Principal:
        p = await authenticate(request)
        if p.is_admin:
            raise Problem(403, "forbidden", "The admin token manages tenants and keys only.")
        if scope is not None and scope not in p.scopes:
            raise Problem(403, "forbidden", f"This operation needs the '{scope}' scope.")
        return p

    return dep


Writer = Annotated[Principal, Depends(require("write"))]
Predictor = Annotated[Principal, Depends(require("predict"))]
Auditor = Annotated[Principal, Depends(require("audit"))]
AnyKey = Annotated[Principal, Depends(require(None))]
Admin = Annotated[Principal, Depends(require_admin)]
