"""Shared test configuration.

- hypothesis profiles: CI runs fewer examples, never zero.
- ``backend``: every API test runs on SQLite and, when OLU_TEST_POSTGRES_URL is set, on PostgreSQL in a
  throwaway database created for this run and dropped afterwards.
- ``server``: the real app served by uvicorn on a loopback port; tests talk to it with httpx.
"""
from __future__ import annotations

import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """``--dist loadgroup`` keeps each ``xdist_group`` on one worker by appending ``@group`` to its tests' ids
    (pytest-xdist's own collection hook, which runs before this one). Where that does not happen (pytest 9.2 with
    pytest-xdist 3.8: the id moved to ``item._id``), the groups' tests would run on several workers at once and fail
    at random (two compose topologies on one subnet, a browser beside podman's interfaces): refuse to run instead."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]]
    if lost:
        message = (f"--dist loadgroup did not group {len(lost)} tests (e.g. {lost[0]}): this pytest-xdist does not work "
                   "with this pytest; install the versions pyproject.toml's test extra allows")
        print(f"\nconftest: {message}", file=sys.__stderr__, flush=True)  # a worker's exception reaches the
        raise pytest.UsageError(message)  # controller as an INTERNALERROR without its text

settings.register_profile("dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ADMIN_TOKEN = "test-admin-" + secrets.token_hex(16)  # the service refuses admin tokens under 32 characters
# the suite starts hundreds of apps in one process: freezing each one's objects (gc_pauses.py) would keep every
# earlier test's garbage cycles for good; tests/test_gc_pauses.py turns it on for itself
os.environ.setdefault("OLU_GC_FREEZE", "0")
PG_URL = os.environ.get("OLU_TEST_POSTGRES_URL")


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels_loaded():
    """Load (or compile, on a cold numba cache) the compiled kernels once before the tests, as ``olu warm`` does
    for a deployment: requests take the numpy path until they are loaded (issue 23), whose learn results agree
    with the compiled loop's to round-off, so without this a test's figures would depend on when the background
    compilation ended.  tests/test_cold_start.py covers the service before the kernels load."""
    from app.unlearning.mechanism import fast, fast_dgauss

    fast.warm_up()
    fast_dgauss.warm_up()


def _pg_admin_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1) if url.startswith("postgresql://") else url


@pytest.fixture(scope="session")
def postgres_url():
    """A fresh PostgreSQL database for this test run (dropped at the end), or a visible skip."""
    if not PG_URL:
        pytest.skip("PostgreSQL tests need OLU_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test)")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(_pg_admin_url(PG_URL))
    name = f"olu_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"PostgreSQL at {base.host}:{base.port} is not usable: {e}")
    yield base.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def backend(request, tmp_path_factory):
    """(name, database URL, data dir) for each database the suite covers."""
    data_dir = tmp_path_factory.mktemp(f"data-{request.param}")
    if request.param == "sqlite":
        return "sqlite", f"sqlite:///{data_dir / 'olu.db'}", data_dir
    return "postgresql", request.getfixturevalue("postgres_url"), data_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    app: object
    data_dir: Path
    database_url: str
    backend: str

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def admin(self) -> httpx.Client:
        return self.client(ADMIN_TOKEN)

    def new_tenant(self, name: str = "t") -> tuple[str, str]:
        with self.admin() as c:
            r = c.post("/v1/tenants", json={"name": name})
            assert r.status_code == 201, r.text
            return r.json()["id"], r.json()["api_key"]


def start_server(database_url: str, data_dir: Path, backend_name: str, **overrides) -> tuple[Server, object]:
    import uvicorn

    from app.config import Settings
    from app.main import create_app

    # the suite makes hundreds of deliberately failed authentications from 127.0.0.1 (test_isolation); servers
    # that test the per-address throttle pass their own auth_failure_limit
    overrides.setdefault("auth_failure_limit", 100_000)
    # and many requests of one tenant as fast as it can (threads, idempotency races): the per-tenant limits are
    # tested by tests/test_tenant_fairness.py, on servers that pass their own
    for name in ("tenant_rate_limit", "tenant_max_in_flight", "tenant_compute_share"):
        overrides.setdefault(name, 0)
    app = create_app(Settings(data_dir=data_dir, database_url=database_url, admin_token=ADMIN_TOKEN, **overrides))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    return Server(f"http://127.0.0.1:{port}", app, data_dir, database_url, backend_name), (server, thread)


@pytest.fixture(scope="session")
def server(backend):
    name, url, data_dir = backend
    srv, (uv, thread) = start_server(url, data_dir, name)
    yield srv
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


@pytest.fixture
def tenant(server):
    """A fresh tenant: (tenant_id, httpx client with its all-scopes key)."""
    tenant_id, key = server.new_tenant()
    with server.client(key) as c:
        yield tenant_id, c
