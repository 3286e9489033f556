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
