"""RFC 9457 problem details.  Every error leaves the service as application/problem+json."""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, PendingRollbackError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import Problem
from ..schemas import Problem as ProblemSchema

PROBLEM_BASE = "/problems/"  # relative URI reference (RFC 9457 §3.1.1), resolved against the service
MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("olu.problems")


def route_of(scope) -> str:
    """What a log line names a request by: its route template (``/v1/audit/records/{record_id}``), never the path,
    which may carry a record id (issue 37, F5-C: no unkeyed trace of a record in any log)."""
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"

TITLES = {
    "model-not-found": "Model not found",
    "record-not-found": "Record not found",
    "record-already-forgotten": "Record already forgotten",
    "duplicate-record": "Duplicate record id",
    "out-of-bounds-input": "Input outside the declared bounds",
    "invalid-dimension": "Wrong feature dimension",
    "invalid-label": "Label not accepted by the model",
    "deletion-capacity-exhausted": "Deletion capacity exhausted",
    "idempotency-key-reused": "Idempotency key reused with a different request",
    "idempotency-request-in-progress": "A request with this idempotency key is in progress",
    "retrain-required": "Model needs a retrain",
    "deletion-features-required": "The forgotten records' features are needed",
    "example-mismatch": "The features sent are not the ones learned",
    "examples-not-accepted": "This model keeps its data: send only the ids",
    "log-size-exceeded": "The tenant's log is shorter than the size asked for",
    "forget-rejected": "The model cannot forget these records",
    "inference-not-ready": "The model does not answer predictions yet",
    "record-not-deletable": "The record cannot be forgotten with a certificate by this model",
    "retrain-not-supported": "This model family keeps no data to retrain on",
    "horizon-reached": "The model has learned as many examples as its declared horizon",
    "invalid-model-spec": "Invalid model specification",
    "features-required": "This model takes feature dictionaries",
    "features-not-declared": "This model declares no feature dictionaries",
    "unknown-feature": "Field not declared in the model's feature spec",
    "out-of-range-feature": "Numeric feature outside its declared range",
    "invalid-features": "Invalid feature dictionary",
    "non-finite-result": "The computation would leave the finite number range",
    "validation-error": "Request validation failed",
    "unauthorized": "Missing or invalid credentials",
    "forbidden": "The key lacks the required scope",
    "not-found": "Not found",
    "bad-request": "Bad request",
    "tenant-not-found": "Tenant not found",
    "key-not-found": "Key not found",
    "receipt-not-found": "Receipt not found",
    "payload-too-large": "Request body too large",
    "batch-too-large": "Too many items in one request",
    "method-not-allowed": "Method not allowed",
    "internal-error": "Internal server error",
    "not-ready": "Service not ready",
    "database-busy": "Database busy",
    "database-unavailable": "Database unavailable",
    "write-conflict": "The model changed while the request was computed",
    "request-deadline-exceeded": "The request's computation overran its deadline",
    "rate-limited": "Too many requests",
    "quota-exceeded": "The tenant's quota would be exceeded",
    "operation-not-found": "Operation not found",
    "operation-abandoned": "The processes running the operation kept stopping",
    "operation-deadline-exceeded": "A step of the operation overran its deadline",
    "unsupported-media-type": "Unsupported media type",
}


def problem_response(status: int, slug: str, detail: str | None = None, headers: dict | None = None,
                     **extra: Any) -> JSONResponse:
    body = {"type": PROBLEM_BASE + slug, "title": TITLES.get(slug, slug.replace("-", " ").capitalize()),
            "status": status}
    if detail:
        body["detail"] = detail
    body.update({k: v for k, v in extra.items() if v is not None})
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _clean_errors(errors: list[dict]) -> list[dict]:
    """Validation errors without echoing the submitted values (they may be large or sensitive)."""
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]


def _allowed_methods(request: Request) -> list[str]:
    """The methods the OpenAPI document lists for the requested path (independent of router internals)."""
    import re

    methods: set[str] = set()
    for template, ops in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, request.url.path):
            methods |= {m.upper() for m in ops}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def install(app: FastAPI) -> None:
    def count(slug: str) -> None:
        metrics = getattr(getattr(app.state, "ctx", None), "metrics", None)
        if metrics is not None:
            metrics.refusals.labels(slug).inc()

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem):
        count(exc.slug)
        return problem_response(exc.status, exc.slug, exc.detail, headers=exc.headers, instance=request.url.path,
                                **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        count("validation-error")
        return problem_response(422, "validation-error", "The request does not match the schema.",
                                instance=request.url.path, errors=_clean_errors(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        slug = {400: "bad-request", 404: "not-found", 405: "method-not-allowed", 401: "unauthorized", 403: "forbidden",
                413: "payload-too-large"}.get(exc.status_code, "error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # RFC 9110: list every method the resource supports, not just one route's
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return problem_response(exc.status_code, slug, str(exc.detail) if exc.detail else None,
                                headers=headers, instance=request.url.path)

    @app.exception_handler(PendingRollbackError)
    @app.exception_handler(PoolTimeout)
    async def _no_connection(request: Request, exc: Exception):
        # a connection that died mid-transaction, or no pooled connection in time (the server is gone or restarting)
        log.warning("database unavailable on %s %s: %s", request.method, route_of(request.scope), type(exc).__name__)
        return _unavailable(request)

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, exc: DBAPIError):
        if is_transient(exc):  # deadlock, serialization failure, lock timeout: rolled back, safe to retry
            log.warning("transient database error on %s %s: %s", request.method, route_of(request.scope),
                        type(exc.orig).__name__)
            return problem_response(503, "database-busy", "The database was busy; nothing was changed. Retry.",
                                    headers={"Retry-After": "1"}, instance=request.url.path)
        if is_unavailable(exc):  # the server went away or refuses connections: the request did not complete
            log.warning("database unavailable on %s %s: %s", request.method, route_of(request.scope),
                        type(exc.orig).__name__)
            return _unavailable(request)
        log.error("database error on %s %s", request.method, route_of(request.scope), exc_info=exc)
        return problem_response(500, "internal-error", "The request failed; nothing was changed.",
                                instance=request.url.path)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, route_of(request.scope))
        return problem_response(500, "internal-error", "The request failed; nothing was changed.",
                                instance=request.url.path)


TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57014"}  # serialization, deadlock, lock n/a, timeout


def is_transient(exc: DBAPIError) -> bool:
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) in TRANSIENT_SQLSTATES:
        return True
    text = str(orig).lower()
    return "database is locked" in text or "database is busy" in text


def _unavailable(request: Request):
    return problem_response(503, "database-unavailable",
                            "The database could not be reached. Retry later; a write retried with the same "
                            "Idempotency-Key is applied at most once.",
                            headers={"Retry-After": "2"}, instance=request.url.path)


# SQLSTATE class 08 (connection exception) and the server shutting down or starting (57P01-57P03)
UNAVAILABLE_SQLSTATES = {"57P01", "57P02", "57P03"}


def is_unavailable(exc: DBAPIError) -> bool:
    """The database server cannot be reached (stopped, restarting, connection lost): a 503, not a 500."""
    if exc.connection_invalidated:
        return True
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None)
    if state is not None:
        return state.startswith("08") or state in UNAVAILABLE_SQLSTATES
    if _client_side_connection_error(orig):
        return True
    # a connection that could not be made has no SQLSTATE (psycopg: "connection failed", "server closed")
    text = str(getattr(exc, "orig", exc)).lower()
    return any(s in text for s in ("connection failed", "connection refused", "server closed the connection",
                                   "connection is closed", "could not connect", "terminating connection",
                                   "the database system is"))


def _client_side_connection_error(orig: BaseException | None) -> bool:
    """psycopg's OperationalError without a SQLSTATE: raised by the client, not reported by the server, only when no
    connection could be made or the one in use was lost -- the host name did not resolve ("failed to resolve host
    'postgres'", what a killed PostgreSQL container gives while its name is out of the network's DNS: the 500s of
    the compose fault test, issue 31 item 4), the connect timed out (ConnectionTimeout), the socket broke.  An error
    the server reports (a constraint, a syntax error, a cancelled statement) always carries its SQLSTATE."""
    if orig is None or not type(orig).__module__.startswith("psycopg"):
        return False
    import psycopg

    return isinstance(orig, psycopg.OperationalError)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of the problem answers a route can give."""
    return {s: {"model": ProblemSchema, "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                "description": "Problem details (RFC 9457)"} for s in statuses}


class ErrorBoundary:
    """Pure ASGI middleware: an unhandled error becomes a 500 problem *without* being re-raised to the server.

    Starlette's ServerErrorMiddleware answers 500 and then re-raises, and uvicorn then drops the keep-alive
    connection, so a client's next request on that connection fails with "connection reset".  Here the error
    is logged once (type and route, with traceback) and the connection stays usable.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:  # noqa: BLE001 - the boundary
            log.exception("unhandled error on %s %s", scope.get("method"), route_of(scope))
            if started:
                raise
            response = problem_response(500, "internal-error", "The request failed; nothing was changed.",
                                        instance=scope.get("path"))
            await response(scope, receive, send)


def document_problems(app: FastAPI) -> None:
    """Make the OpenAPI document say what the service really answers.

    FastAPI documents its own 422 body (HTTPValidationError, application/json) for every operation with
    parameters, but every error here is an RFC 9457 problem (application/problem+json).  Also documents the
    answers of the middleware: 400/413 for unreadable or oversized bodies, 429 (rate limit, with Retry-After),
    and 503 database-busy (a transient database conflict; retry) or database-unavailable (the database cannot be
    reached; retry).
    """
    original = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        doc = original()
        problem = {"description": "Problem details (RFC 9457)",
                   "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
        retry = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
        for path, ops in doc.get("paths", {}).items():
            for method, op in ops.items():
                rs = op.setdefault("responses", {})
                if "HTTPValidationError" in str(rs.get("422", "")):
                    rs["422"] = dict(problem)
                if method in ("post", "put", "patch"):
                    rs.setdefault("400", dict(problem))
                    rs.setdefault("413", dict(problem))
                    rs.setdefault("415", dict(problem))  # a body without a content type the route reads
                    rs.setdefault("422", dict(problem))
                rs.setdefault("429", {**problem, "headers": retry})
                if path.startswith("/v1/"):
                    rs.setdefault("503", {**problem, "headers": retry})
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
