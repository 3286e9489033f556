"""The per-process cache of API key checks (OLU_AUTH_CACHE_SECONDS).

- a key revoked through this process is refused on its next request, even while cached;
- a key revoked elsewhere (another replica, the CLI: another TenantService on the same database) is refused
  once the TTL has passed (time simulated with a fake clock, no sleeping);
- a lookup that raced a revocation is not cached; 0 turns the cache off.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import pytest

from app.db.session import Database
from app.services.tenants import TenantService


class FakeClock:
    def __init__(self):
        self.now = time.monotonic()  # entries left behind expire as with the real clock

    def __call__(self) -> float:
        return self.now


@contextmanager
def frozen_clock(tenants: TenantService):
    clock, saved = FakeClock(), tenants.clock
    tenants.clock = clock
    try:
        yield clock
    finally:
        tenants.clock = saved


def _new_key(server, tenant_id: str) -> dict:
    with server.admin() as adm:
        r = adm.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["write", "predict", "audit"]})
        assert r.status_code == 201, r.text
        return r.json()


def test_revoked_through_this_process_is_refused_at_once(server):
    tenant_id, _ = server.new_tenant("auth-cache-local")
    key = _new_key(server, tenant_id)
    tenants = server.app.state.ctx.tenants
    assert tenants.auth_cache_seconds > 0  # the default keeps checks: the revocation must purge them
    with frozen_clock(tenants), server.client(key["api_key"]) as c:
        assert c.get("/v1/models").status_code == 200  # now cached
        assert tenants.cached_principal(key["api_key"]) is not None
        with server.admin() as adm:
            assert adm.delete(f"/v1/tenants/{tenant_id}/keys/{key['id']}").status_code == 204
        r = c.get("/v1/models")
        assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")


def test_revoked_elsewhere_is_refused_after_the_ttl(server):
    tenant_id, _ = server.new_tenant("auth-cache-remote")
    key = _new_key(server, tenant_id)
    tenants = server.app.state.ctx.tenants
    other_db = Database(server.database_url)  # another replica (or the CLI) on the same database
    try:
        with frozen_clock(tenants) as clock, server.client(key["api_key"]) as c:
            assert c.get("/v1/models").status_code == 200
            TenantService(other_db).revoke_key(tenant_id, key["id"])
            assert c.get("/v1/models").status_code == 200  # still cached here: the documented lag
            clock.now += tenants.auth_cache_seconds
            assert c.get("/v1/models").status_code == 401
    finally:
        other_db.dispose()


@pytest.fixture
def db(tmp_path):
    from app.db.migrate import upgrade_to_head

    database = Database(f"sqlite:///{tmp_path / 'auth.db'}")
    upgrade_to_head(database.engine)
    yield database
    database.dispose()


def test_ttl_bounds_the_lag_and_zero_turns_the_cache_off(db):
    clock = FakeClock()
    here, elsewhere = TenantService(db, auth_cache_seconds=0.5, clock=clock), TenantService(db)
    raw = here.create_tenant("t")["api_key"]
    p = here.authenticate(raw)
    assert p is not None and p.scopes == frozenset({"write", "predict", "audit"})
    key_id = p.key_id
    uncached = TenantService(db, auth_cache_seconds=0, clock=clock)
    assert uncached.authenticate(raw) == p and uncached.cached_principal(raw) is None

    elsewhere.revoke_key(p.tenant_id, key_id)
    clock.now += 0.49
    assert here.cached_principal(raw) == p and here.authenticate(raw) == p  # within the TTL
    clock.now += 0.01
    assert here.cached_principal(raw) is None and here.authenticate(raw) is None
    assert uncached.authenticate(raw) is None
    assert here.authenticate(raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None  # a wrong secret never hits


def test_a_lookup_racing_a_revocation_is_not_cached(db):
    svc = TenantService(db, auth_cache_seconds=5, clock=FakeClock())
    tenant = svc.create_tenant("t")
    key = svc.create_key(tenant["id"], ["predict"], None)

    class RacingEngine:
        """The key row is read before the revocation commits; the revocation completes before caching."""

        @contextmanager
        def connect(self):
            with db.engine.connect() as c:
                yield c
            svc.db = db
            svc.revoke_key(tenant["id"], key["id"])

    svc.db = type("RacingDb", (), {"engine": RacingEngine()})()
    assert svc.authenticate(key["api_key"]) is not None  # this request read the key before it was revoked
    assert svc.db is db
    assert svc.cached_principal(key["api_key"]) is None and svc.authenticate(key["api_key"]) is None
