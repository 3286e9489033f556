"""The composition root: ``create_app(settings)`` builds every global object; ``app`` is the ASGI app."""
from __future__ import annotations

import logging
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute

from .api import admin, audit, console, docs_pages, evaluation, models, operations, problems, system
from .api.clientaddr import ClientAddress, ClientResolver
from .api.limits import BodySizeLimit
from .api.media_type import RequireMediaType
from .api.query import known_query_parameters
from .api.decode_pool import DecodePool
from .api.fairness import FairScheduler, TenantLimiter, compute_slots
from .api.operation_turns import turns_of
from .api.ratelimit import AuthFailureThrottle, RateLimit
from .api.shared_limits import SharedTenantLimiter
from . import gc_pauses
from .config import Settings
from .crypto import Cipher
from .db.migrate import migration_status, upgrade_to_head
from .db.session import Database
from .observability import Metrics, ObservabilityMiddleware, configure_logging
from .registry import ModelRegistry
from .startup import (ConfigurationError, database_unreachable, load_cipher, load_keyring, load_settings,
                      open_database, prepare_data_dir, refuse)
from .unlearning import kernels_status
from .unlearning.maths.blas import limit_process
from .services.idempotency import IdempotencyStore
from .services.models import ModelService
from .services.operation_runner import OperationRunner
from .services.operation_start import OperationStarts
from .services.operations import OperationStore
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
    operations: OperationStore | None = None  # long work as operations (services/operations.py)
    operation_starts: OperationStarts | None = None
    operation_runner: OperationRunner | None = None
    decode_pool: DecodePool | None = None  # large learn bodies decoded in another process (api/decode_pool.py)

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


def check_settings(settings: Settings) -> ClientResolver:
    """Refuses settings that cannot be served safely; answers the client-address resolver they configure."""
    admin = settings.admin_token
    if admin is not None and len(admin.get_secret_value()) < MIN_ADMIN_TOKEN:
        raise ConfigurationError(
            f"OLU_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN} characters long (it has "
            f"{len(admin.get_secret_value())}); generate one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))', or unset it to serve without an admin.")
    if settings.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigurationError(f"OLU_LOG_LEVEL={settings.log_level!r} is not a level: use DEBUG, INFO, WARNING or "
                                 "ERROR")
    if settings.sqlite_synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ConfigurationError(f"OLU_SQLITE_SYNCHRONOUS={settings.sqlite_synchronous!r} is not a SQLite "
                                 "synchronous mode: use FULL (durable commits, the default), EXTRA, NORMAL or OFF")
    try:
        return ClientResolver(settings.trusted_proxies, settings.forwarded_header)
    except ValueError as e:
        raise ConfigurationError(str(e)) from None


def tenant_limiter(settings: Settings, db: Database) -> TenantLimiter:
    """The per-tenant limits (api/fairness.py), shared by the replicas through PostgreSQL when
    ``OLU_TENANT_LIMITS_SCOPE`` says so (api/shared_limits.py, issue 37 item 5)."""
    args = (settings.tenant_rate_limit, settings.tenant_rate_limit_burst, settings.tenant_max_in_flight,
            settings.tenant_compute_share, settings.tenant_compute_burst_seconds, settings.tenant_refusal_delay)
    scope = settings.tenant_limits_scope
    if scope == "deployment" and db.is_sqlite:
        raise ConfigurationError("OLU_TENANT_LIMITS_SCOPE=deployment needs PostgreSQL (OLU_DATABASE_URL): a SQLite "
                                 "database serves one process, whose limits are the deployment's already")
    if scope == "process" or db.is_sqlite:
        return TenantLimiter(*args)
    return SharedTenantLimiter(db, *args, lease_seconds=settings.tenant_limit_lease_seconds)


def open_storage(settings: Settings) -> tuple[Database, Cipher]:
    """The database and the at-rest cipher, migrated when auto_migrate is on, the SQLite WAL scrubbed (crash
    recovery: WAL frames of a forget that committed before a crash go, docs/operations.md). Shared by the API and
    ``olu consume``."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    prepare_data_dir(settings)  # 0700, and an existing install's files tightened to 0600
    db = open_database(settings)
    cipher = load_cipher(settings)
    if settings.auto_migrate:
        try:
            upgrade_to_head(db.engine, cipher)
        except (OperationalError, DBAPIError) as e:  # refused, unreachable, no such database, bad login
            db.dispose()
            raise database_unreachable(settings, e) from None
    db.scrub_wal()
    return db, cipher


def _log_kernel_warmup() -> None:
    """Say that the compiled kernels are compiling in the background (a cold numba cache: ~30 s to minutes), and
    when they are loaded; requests take the numpy path meanwhile and /readyz says kernels: compiling."""
    import threading
    import time

    if kernels_status() != "compiling":
        return
    log.info("compiling the numba kernels in the background (about 30 s to a few minutes with a cold cache); "
             "requests are served on the numpy path meanwhile and /readyz answers kernels: compiling until they "
             "load; `olu warm` builds the cache once, so that later starts load them in about a second")
    started = time.monotonic()

    def watch() -> None:
        while kernels_status() == "compiling":
            time.sleep(0.5)
        log.info("compiled kernels %s after %.0f s", "loaded" if kernels_status() == "ok" else kernels_status(),
                 time.monotonic() - started)

    threading.Thread(target=watch, name="olu-kernel-watch", daemon=True).start()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()
    clients = check_settings(settings)
    configure_logging(settings.log_level)  # before the storage: what start-up creates (keys) is logged
    prepare_data_dir(settings)
    keyring = load_keyring(settings)  # before the storage: a refused key leaves nothing created or migrated
    db, cipher = open_storage(settings)
    limit_process(settings.blas_threads)  # before any request: one BLAS thread by default (config.py blas_threads)
    registry = ModelRegistry(cipher=cipher, state_log=settings.state_log)
    _log_kernel_warmup()
    metrics = Metrics()
    tenants = TenantService(db, cipher, settings.auth_cache_seconds)
    ctx = Context(settings, db, keyring, tenants,
                  ModelService(db, registry, ReceiptIssuer(keyring), settings, metrics),
                  IdempotencyStore(db, settings.idempotency_stale_seconds, settings.idempotency_retention_seconds,
                                   open_key=tenants.record_key), metrics,
                  AuthFailureThrottle(settings.auth_failure_limit, settings.auth_failure_window,
                                      settings.auth_failure_max_addresses) if settings.auth_failure_limit else None)
    limiter = tenant_limiter(settings, db)
    if limiter.enabled:
        ctx.tenant_limits = limiter
        ctx.tenants.on_revoke = lambda tenant_id, digest: limiter.forget(tenant_id, digest)
    if settings.gil_switch_interval:  # process-wide: the event loop's wait behind a computing thread (issue 29)
        sys.setswitchinterval(settings.gil_switch_interval)
    slots = compute_slots(settings.compute_slots)
    if slots:
        ctx.scheduler = FairScheduler(slots)
    if settings.decode_process_bytes:
        ctx.decode_pool = DecodePool(settings.decode_processes)
        ctx.models.core.commitments = ctx.decode_pool.commitments  # many ids' HMACs off this process's GIL
    ctx.operations = OperationStore(db, cipher, settings)
    ctx.operation_starts = OperationStarts(ctx.models.core, ctx.operations)
    ctx.operation_runner = OperationRunner(ctx.operations, ctx.models.core, settings, turns_of(ctx.scheduler))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await ctx.operation_runner.start()  # runs operations here unless OLU_OPERATION_WORKERS=0
        if settings.gc_freeze:  # short full collections (issue 37)
            gc_pauses.freeze_at_start_up(lambda: kernels_status() == "compiling")
        yield
        await ctx.operation_runner.stop()  # the running ones are given back (queued again)
        if isinstance(ctx.tenant_limits, SharedTenantLimiter):
            await ctx.tenant_limits.close()  # this replica's in-flight slots are given back
        ctx.models.gates.shutdown()  # abandoned computations (request deadline) are not waited for
        if ctx.decode_pool is not None:
            ctx.decode_pool.shutdown()
        db.dispose()

    app = _Service(
        clients,
        lifespan=lifespan,
        title="Certified unlearning service",
        version="1.0.0",
        description="Learn, unlearn and predict on streaming models; every forget is answered with a signed "
                    "certificate receipt. Only published parameters ever leave the service: noisy for the noise "
                    "families, exact for retrain, sisa and exact_ridge (whose publication private releases them "
                    "with noise).",
        generate_unique_id_function=_operation_id,
        docs_url=None, redoc_url=None,  # served from packaged assets instead of a CDN (api/docs_pages.py)
    )
    app.state.ctx = ctx
    problems.install(app)
    problems.document_problems(app)
    for router in (admin.router, admin.own, models.router, evaluation.router, operations.router, audit.router,
                   system.router):
        app.include_router(router, dependencies=[Depends(known_query_parameters)])
    models.install_openapi(app)  # the learn body schemas (both shapes)
    evaluation.install_openapi(app)  # and the evaluate body's
    system.install_hyperparameter_schemas(app)  # every family's hyperparameter schema, linked from ModelCreate
    console.install(app)  # the read-only audit console at /console (static files, not in the OpenAPI document)
    docs_pages.install(app)  # /docs, /redoc and / with no asset from elsewhere (not in the OpenAPI document)
    app.add_middleware(RequireMediaType)  # innermost: 415 for a body the route cannot read (api/media_type.py)
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
            refuse(e)
        globals()["app"] = application
        return application
    raise AttributeError(name)
