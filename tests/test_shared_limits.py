"""Per-tenant limits that hold for the deployment (issue 37 item 5; app/api/shared_limits.py), on PostgreSQL.

Two ``SharedTenantLimiter`` instances on one database stand for two replicas: together they admit no more than the
tenant's bucket holds, share its in-flight slots, give unused slots back and stop counting a dead replica's slots
after their expiry.  Then two real uvicorn processes on one PostgreSQL database hold one tenant, flooded through both,
to its rate within 1.2x.  Needs OLU_TEST_POSTGRES_URL (skipped otherwise)."""
from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from app.api import shared_limits
from app.api.fairness import TenantLimiter
from app.api.shared_limits import SharedTenantLimiter
from app.db.migrate import upgrade_to_head
from app.db.session import Database
from tests.procs import ServiceProcess, service_env


@pytest.fixture(scope="module")
def db(postgres_url):
    d = Database(postgres_url)
    upgrade_to_head(d.engine)
    yield d
    d.dispose()


def _pair(db, **kw):
    args = {"rate": kw.get("rate"), "burst": kw.get("burst"), "max_in_flight": kw.get("max_in_flight"),
            "compute_share": None, "compute_burst": None}
    return (SharedTenantLimiter(db, **args, lease_seconds=kw.get("lease", 0.05)),
            SharedTenantLimiter(db, **args, lease_seconds=kw.get("lease", 0.05)))


def test_two_replicas_admit_at_most_the_shared_bucket(db):
    a, b = _pair(db, rate=2.0, burst=30.0, lease=2.0)  # leases of 4 tokens
    assert a.lease == 4

    async def flood():
        admitted = 0
        start = time.monotonic()
        for i in range(200):
            limiter = a if i % 2 else b
            if await limiter.admit_async("ten_rate") is None:
                admitted += 1
                limiter.release("ten_rate")
        return admitted, time.monotonic() - start

    admitted, elapsed = asyncio.run(flood())
    # one process alone would admit burst + rate * elapsed; per-process limits would admit twice that
    assert 30 <= admitted <= 30 + math.ceil(2.0 * elapsed) + 1, (admitted, elapsed)
    assert a.round_trips + b.round_trips < admitted  # leases: not one database call per request


def test_concurrent_admissions_on_one_replica_share_its_database_calls(db):
    a, b = _pair(db, rate=1.0, burst=20.0, max_in_flight=100, lease=4.0)  # leases of 4 tokens

    async def go():
        answers = await asyncio.gather(*(lim.admit_async("ten_many") for lim in [a, b] * 40))
        return sum(r is None for r in answers), [r.limit for r in answers if r is not None]

    admitted, refused = asyncio.run(go())
    assert 1 <= admitted <= 20 + 2, admitted  # the burst, and at most a token or two refilled meanwhile
    assert set(refused) <= {"tenant-requests"}
    assert a.round_trips + b.round_trips <= admitted  # waiting requests share a call instead of making their own


def test_a_refusal_names_the_deployment_and_a_retry(db):
    a, _ = _pair(db, rate=0.5, burst=1.0)

    async def go():
        assert await a.admit_async("ten_retry") is None
        return await a.admit_async("ten_retry")

    refusal = asyncio.run(go())
    assert refusal.limit == "tenant-requests" and refusal.retry_after >= 1


def test_in_flight_slots_are_shared_given_back_and_expire(db, monkeypatch):
    a, b = _pair(db, max_in_flight=3)

    async def go():
        for _ in range(3):
            assert await a.admit_async("ten_slots") is None
        refused = await b.admit_async("ten_slots")
        assert refused is not None and refused.limit == "tenant-concurrency"
        assert "over the deployment" in refused.detail
        a.release("ten_slots")
        await a.sweep()  # the slot was in use during this period: kept
        b._leases["ten_slots"].slot_retry_at = 0.0
        assert await b.admit_async("ten_slots") is not None
        await a.sweep()  # unused for a whole period: given back
        b._leases["ten_slots"].slot_retry_at = 0.0
        assert await b.admit_async("ten_slots") is None
        # a dies holding 2 slots: no heartbeat; they stop counting after SLOT_TTL
        monkeypatch.setattr(shared_limits, "SLOT_TTL", 0.5)
        await b.sweep()
        b._leases["ten_slots"].slot_retry_at = 0.0
        assert await b.admit_async("ten_slots") is not None
        await asyncio.sleep(shared_limits.SLOT_TTL + 0.3)
        with db.engine.begin() as conn:  # a's rows were written with the old expiry: age them as a dead replica's
            conn.exec_driver_sql("UPDATE tenant_slots SET expires_at = expires_at - 10 WHERE replica = %s",
                                 (a.replica,))
        b._leases["ten_slots"].slot_retry_at = 0.0
        assert await b.admit_async("ten_slots") is None
        assert await b.admit_async("ten_slots") is None
        await b.close()

    asyncio.run(go())


def test_process_limiter_is_unchanged_by_the_hooks():
    limiter = TenantLimiter(rate=1.0, burst=2.0, max_in_flight=None, compute_share=None, compute_burst=None,
                            clock=lambda: 0.0)
    assert limiter.admit("t") is None and limiter.admit("t") is None
    assert limiter.admit("t").limit == "tenant-requests"
    assert limiter.where == "in this process"


RATE, BURST, WINDOW = 20.0, 20.0, 4.0


def test_two_uvicorn_processes_hold_one_tenant_to_its_rate(postgres_url, tmp_path):
    env = service_env(tmp_path / "data", postgres_url, OLU_TENANT_RATE_LIMIT=str(RATE),
                      OLU_TENANT_RATE_LIMIT_BURST=str(BURST), OLU_TENANT_MAX_IN_FLIGHT="0",
                      OLU_TENANT_COMPUTE_SHARE="0", OLU_TENANT_REFUSAL_DELAY="0", OLU_RATE_LIMIT="0",
                      OLU_TENANT_LIMITS_SCOPE="deployment", OLU_AUTH_FAILURE_LIMIT="0")
    (tmp_path / "data").mkdir()
    first = ServiceProcess(env, tmp_path / "a.log").start(timeout=180)
    second = ServiceProcess(env, tmp_path / "b.log").start(timeout=180)
    try:
        _, key = first.new_tenant("flooded")
        counts = [0, 0]
        refused = [0, 0]
        spans = []

        def flood(i: int, svc: ServiceProcess) -> None:
            with svc.client(key, timeout=30) as c:
                start = time.monotonic()
                while time.monotonic() - start < WINDOW:
                    r = c.get("/v1/tenant")
                    if r.status_code == 200:
                        counts[i] += 1
                    else:
                        assert r.status_code == 429 and r.json()["limit"] == "tenant-requests", r.text
                        refused[i] += 1
                spans.append(time.monotonic() - start)

        threads = [threading.Thread(target=flood, args=(i, s)) for i, s in enumerate((first, second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        allowed = BURST + RATE * max(spans)  # what one process alone would admit at most
        assert sum(counts) <= 1.2 * allowed, (counts, refused, spans)
        assert min(counts) > 0 and sum(refused) > 0, (counts, refused)  # both replicas served, both were limited
    finally:
        first.stop()
        second.stop()


def test_scope_setting_picks_the_limiter(tmp_path):
    from app.config import Settings
    from app.main import tenant_limiter
    from app.startup import ConfigurationError

    sqlite = Database(f"sqlite:///{tmp_path / 's.db'}")
    try:
        assert type(tenant_limiter(Settings(tenant_limits_scope="auto"), sqlite)) is TenantLimiter
        with pytest.raises(ConfigurationError, match="needs PostgreSQL"):
            tenant_limiter(Settings(tenant_limits_scope="deployment"), sqlite)
    finally:
        sqlite.dispose()


def test_scope_setting_on_postgresql(db):
    from app.config import Settings
    from app.main import tenant_limiter

    assert type(tenant_limiter(Settings(tenant_limits_scope="process"), db)) is TenantLimiter
    shared = tenant_limiter(Settings(tenant_limits_scope="auto", tenant_rate_limit=200), db)
    assert isinstance(shared, SharedTenantLimiter) and shared.lease == 10
