"""A database that cannot be reached is a 503 with Retry-After, not a 500 (found by the compose fault test, issue
31 item 4: with the PostgreSQL container killed, in-flight and following requests answered 500 internal-error).
The service's problem handlers on the errors psycopg and SQLAlchemy raise when the server is gone: connection
refused or closed, a connection invalidated mid-transaction, no pooled connection in time."""
from __future__ import annotations

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError, OperationalError, PendingRollbackError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.api import problems


def _app(exc: Exception) -> FastAPI:
    app = FastAPI()
    problems.install(app)

    @app.get("/boom")
    def boom():
        raise exc

    return app


@pytest.mark.parametrize("orig", [
    psycopg.OperationalError("connection failed: connection to server at \"127.0.0.1\", port 5432 failed: "
                             "Connection refused"),
    psycopg.OperationalError("server closed the connection unexpectedly"),
    psycopg.OperationalError("consuming input failed: terminating connection due to administrator command"),
])
def test_unreachable_database_is_503(orig):
    r = TestClient(_app(OperationalError("SELECT 1", {}, orig)), raise_server_exceptions=False).get("/boom")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["type"].endswith("database-unavailable") and r.headers["retry-after"] == "2"
    assert "SELECT" not in r.text and "127.0.0.1" not in r.text  # nothing of the statement or the server leaks


def test_invalidated_connection_is_503():
    exc = OperationalError("SELECT 1", {}, Exception("boom"), connection_invalidated=True)
    assert TestClient(_app(exc), raise_server_exceptions=False).get("/boom").status_code == 503


def test_other_database_errors_stay_500():
    """A constraint violation is a bug, not an outage: it must not be disguised as a retryable 503."""
    exc = IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed: models.id"))
    r = TestClient(_app(exc), raise_server_exceptions=False).get("/boom")
    assert r.status_code == 500 and r.json()["type"].endswith("internal-error")


@pytest.mark.parametrize("exc", [PendingRollbackError("connection invalidated mid-transaction"),
                                 PoolTimeout("QueuePool limit reached")])
def test_lost_or_no_connection_is_503(exc):
    r = TestClient(_app(exc), raise_server_exceptions=False).get("/boom")
    assert r.status_code == 503 and r.json()["type"].endswith("database-unavailable"), r.text


def _engine_app(url: str) -> FastAPI:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, pool_pre_ping=True)
    app = FastAPI()
    problems.install(app)

    @app.get("/count")
    def count():
        with engine.connect() as c:
            return {"n": c.execute(text("SELECT 1")).scalar()}

    return app


def test_database_host_that_does_not_resolve_is_503(monkeypatch):
    """The path of the compose fault test's 500s: a killed PostgreSQL container leaves the network's DNS, and psycopg
    (3.2+) resolves the host itself, raising OperationalError("failed to resolve host 'postgres': [Errno -2] ...")
    with no SQLSTATE and none of the libpq phrases.  Real engine, real psycopg; only the resolver is made to fail
    (as it does for a container that is gone), so the test neither waits on nor depends on a DNS server."""
    import socket

    from psycopg import _conninfo_attempts

    def gone(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(_conninfo_attempts.socket, "getaddrinfo", gone)
    r = TestClient(_engine_app("postgresql+psycopg://olu@postgres:5432/olu"),
                   raise_server_exceptions=False).get("/count")
    assert r.status_code == 503, r.text
    assert r.json()["type"].endswith("database-unavailable") and r.headers["retry-after"] == "2"
    assert "postgres" not in r.json().get("detail", "")


@pytest.mark.parametrize("orig", [
    psycopg.OperationalError("failed to resolve host 'postgres': [Errno -3] Temporary failure in name resolution"),
    psycopg.errors.ConnectionTimeout("connection timeout expired"),
    psycopg.OperationalError("connection is bad: no connection to the server"),
])
def test_client_side_connection_errors_are_503(orig):
    """psycopg's OperationalError without a SQLSTATE comes from the client when there is no connection."""
    r = TestClient(_app(OperationalError("SELECT 1", {}, orig)), raise_server_exceptions=False).get("/boom")
    assert r.status_code == 503, r.text


def test_server_reported_operational_error_stays_500():
    """An OperationalError the server reports carries its SQLSTATE (here 53100, disk full): not an outage of the
    connection, so it is not dressed as a retryable 503 by the no-SQLSTATE rule."""
    orig = psycopg.errors.DiskFull("could not extend file")
    assert orig.sqlstate == "53100"
    r = TestClient(_app(OperationalError("INSERT", {}, orig)), raise_server_exceptions=False).get("/boom")
    assert r.status_code == 500, r.text
