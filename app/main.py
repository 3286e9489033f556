"""The composition root: ``create_app(settings)`` builds every global object; ``app`` is the ASGI app."""
from __future__ import annotations

import logging
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.routing import APIRoute

from .api import admin, audit, console, evaluation, models, problems, system
from .api.clientaddr import ClientAddress, ClientResolver
from .api.limits import BodySizeLimit
from .api.fairness import FairScheduler, TenantLimiter, compute_slots
from .api.ratelimit import AuthFailureThrottle, RateLimit
from .config import Settings
from .crypto import Cipher, load_cipher
from .db.files import secure_data_dir
from .db.migrate import migration_status, upgrade_to_head
from .db.session import Database
from .observability import Metrics, ObservabilityMiddleware, configure_logging
from .receipts.keystore import load_or_create_keyring
from .registry import ModelRegistry
from .unlearning import kernels_status
from .services.idempotency import IdempotencyStore
from .services.models import ModelService
from .services.receipts import ReceiptIssuer
from .services.tenants import TenantService

log = logging.getLogger("olu")


@dataclass
class Context:
    settings: Settings
    db: Database
    keyring: object
    tenants: TenantService
    models: ModelService
    idempotency: IdempotencyStore
    metrics: Metrics
    auth_failures: AuthFailureThrottle | None = None  # failed authentications per client address and token
    tenant_limits: TenantLimiter | None = None  # per-tenant requests, concurrency and compute (api/fairness.py)
    scheduler: FairScheduler | None = None  # per-tenant queues in front of the compute (api/fairness.py)

    def readiness(self) -> dict[str, str]:
        checks = {}
        try:
            checks["database"] = "ok"
            checks["schema"] = "ok" if migration_status(self.db.engine) == "head" else "not at head"
        except Exception:  # noqa: BLE001 - readiness reports, never raises
            checks["database"] = "unreachable"
            checks["schema"] = "unknown"
        checks["signing_key"] = "ok" if getattr(self.keyring, "active", None) is not None else "missing"
        # until the compiled kernels are loaded every request takes the numpy path (no request waits for the
        # compiler), but large models run slower there: "compiling" keeps the replica unready (api/system.py)
        checks["kernels"] = kernels_status()
        return checks


def _operation_id(route: APIRoute) -> str:
    return route.name  # stable, readable SDK method names (create_model, learn, unlearn, ...)


class _Service(FastAPI):
    """FastAPI with the client-address resolution outside Starlette's own outermost middleware (which wraps
    ``send``, hiding the server's transport, so the socket peer, from everything inside it)."""

    def __init__(self, clients: ClientResolver, **kwargs):
        self._clients = clients
        super().__init__(**kwargs)

    def build_middleware_stack(self):
        return ClientAddress(super().build_middleware_stack(), self._clients)


MIN_ADMIN_TOKEN = 32  # characters; a shorter bearer token is guessable


class ConfigurationError(RuntimeError):
    """The settings cannot be served safely; the message says which variable and why."""


def check_settings(settings: Settings) -> ClientResolver:
    """Refuses settings that cannot be served safely; answers the client-address resolver they configure."""
    admin = settings.admin_token
    if admin is not None and len(admin.get_secret_value()) < MIN_ADMIN_TOKEN:
        raise ConfigurationError(
            f"OLU_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN} characters long (it has "
            f"{len(admin.get_secret_value())}); generate one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))', or unset it to serve without an admin.")
    try:
        return ClientResolver(settings.trusted_proxies, settings.forwarded_header)
    except ValueError as e:
        raise ConfigurationError(str(e)) from None


def open_storage(settings: Settings) -> tuple[Database, Cipher]:
    """The database and the at-rest cipher, migrated when auto_migrate is on, the SQLite WAL scrubbed (crash
    recovery: WAL frames of a forget that committed before a crash go, docs/operations.md). Shared by the API and
    ``olu consume``."""
    secure_data_dir(settings.data_dir)  # 0700, and an existing install's files tightened to 0600
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    cipher = load_cipher(settings.data_dir,
                         settings.encryption_key.get_secret_value() if settings.encryption_key else None,
                         settings.encryption_keys_old.get_secret_value() if settings.encryption_keys_old else None)
    if settings.auto_migrate:
        upgrade_to_head(db.engine, cipher)
    db.scrub_wal()
    return db, cipher


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    clients = check_settings(settings)
    db, cipher = open_storage(settings)
    keyring = load_or_create_keyring(
        settings.data_dir,
        settings.signing_key.get_secret_value() if settings.signing_key else None,
        settings.signing_key_file,
    )
    configure_logging(settings.log_level)
    registry = ModelRegistry(cipher=cipher)
    metrics = Metrics()
    ctx = Context(settings, db, keyring, TenantService(db, cipher, settings.auth_cache_seconds),
                  ModelService(db, registry, ReceiptIssuer(keyring), settings, metrics),
                  IdempotencyStore(db, settings.idempotency_stale_seconds), metrics,
                  AuthFailureThrottle(settings.auth_failure_limit, settings.auth_failure_window,
                                      settings.auth_failure_max_addresses) if settings.auth_failure_limit else None)
    limiter = TenantLimiter(settings.tenant_rate_limit, settings.tenant_rate_limit_burst, settings.tenant_max_in_flight,
                            settings.tenant_compute_share, settings.tenant_compute_burst_seconds,
                            settings.tenant_refusal_delay)
    if limiter.enabled:
        ctx.tenant_limits = limiter
        ctx.tenants.on_revoke = lambda tenant_id, digest: limiter.forget(tenant_id, digest)
    if settings.gil_switch_interval:  # process-wide: the event loop's wait behind a computing thread (issue 29)
        sys.setswitchinterval(settings.gil_switch_interval)
    slots = compute_slots(settings.compute_slots)
    if slots:
        ctx.scheduler = FairScheduler(slots)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        ctx.models.gates.shutdown()  # abandoned computations (request deadline) are not waited for
        db.dispose()

    app = _Service(
        clients,
        lifespan=lifespan,
        title="Certified unlearning service",
        version="1.0.0",
        description="Learn, unlearn and predict on streaming models; every forget is answered with a signed "
                    "certificate receipt. Only published (noisy) parameters ever leave the service.",
        generate_unique_id_function=_operation_id,
    )
    app.state.ctx = ctx
    problems.install(app)
    problems.document_problems(app)
    for router in (admin.router, admin.own, models.router, evaluation.router, audit.router, system.router):
        app.include_router(router)
    models.install_openapi(app)  # the learn body schemas (both shapes)
    evaluation.install_openapi(app)  # and the evaluate body's
    console.install(app)  # the read-only audit console at /console (static files, not in the OpenAPI document)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RateLimit, rate=settings.rate_limit or 0, burst=settings.rate_limit_burst,
                       tenants=ctx.tenant_limits, metrics=metrics)
    app.add_middleware(ObservabilityMiddleware, metrics=metrics)
    app.add_middleware(problems.ErrorBoundary)  # outermost of ours: a 500 never drops the client's connection

    return app


def __getattr__(name: str):
    """``app.main:app`` builds the application from the environment on first access (uvicorn app.main:app)."""
    if name == "app":
        try:
            application = create_app()
        except ConfigurationError as e:  # a clear one-line refusal instead of a traceback from the ASGI server
            raise SystemExit(f"olu: refusing to start: {e}") from None
        globals()["app"] = application
        return application
    raise AttributeError(name)
