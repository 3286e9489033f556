"""Usage counter shards with quota escrow (issue 37 item 6; app/db/usage_shards.py), on SQLite and, with
OLU_TEST_POSTGRES_URL, PostgreSQL.

Concurrent growing writes to many models of one tenant pass a quota exactly as one lock would let them (as many as
fit, no more, none refused that fit), a seeded random sequence of growths, shrinks, unchecked changes and quota
changes is accepted exactly when the committed usage plus the change fits, and the slices never sum past the
quota."""
from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from app.db import usage_shards
from app.db.migrate import upgrade_to_head
from app.db.session import Database


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'u.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    d = Database(url)
    upgrade_to_head(d.engine)
    yield d
    d.dispose()


def _tenant(db, tid: str) -> None:
    with db.engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id, name, record_key, log_size, created_at) VALUES (:t, 'n', :k, 0, "
                          ":now)"), {"t": tid, "k": b"k", "now": datetime.now(UTC)})


def _write(db, tid: str, mid: str, limits: dict, records: int, checked=("records",), hold: float = 0.0) -> bool:
    try:
        with db.write() as s:
            usage_shards.note(s, tid, mid, records=records)
            if checked:
                usage_shards.grow(s, tid, limits, checked)
            time.sleep(hold)  # keep the shard's lock while others write
        return True
    except usage_shards.QuotaExceeded:
        return False


def _state(db, tid: str) -> tuple[tuple[int, int, int], int]:
    with db.engine.connect() as conn:
        caps = conn.execute(text("SELECT COALESCE(SUM(cap_records), 0) FROM tenant_usage_shards WHERE tenant_id = :t"),
                            {"t": tid}).scalar_one()
        return usage_shards.usage(conn, tid), int(caps)


def test_concurrent_writes_to_many_models_pass_the_quota_exactly(db):
    _tenant(db, "ten_race")
    limits = {"models": None, "records": 50, "bytes": None}
    mids = [f"mdl_{i}" for i in range(8)]
    assert len({usage_shards.shard_of(m) for m in mids}) > 1
    start = threading.Barrier(24)
    results: list[bool] = []

    def go(i: int) -> None:
        start.wait()
        results.append(_write(db, "ten_race", mids[i % 8], limits, 3, hold=0.01))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 16, results  # 16 x 3 = 48 <= 50; a 17th would make 51
    usage, caps = _state(db, "ten_race")
    assert usage[1] == 48 and caps <= 50


def test_random_sequence_is_accepted_exactly_when_it_fits(db):
    _tenant(db, "ten_seq")
    rng = random.Random(37)
    limit = 100
    total = 0
    mids = [f"mdl_{i}" for i in range(12)]
    for step in range(150):
        if rng.random() < 0.05:
            limit = rng.choice([60, 100, 140])  # the admin changes the quota: the slices are stale
        limits = {"models": None, "records": limit, "bytes": None}
        kind = rng.random()
        mid = rng.choice(mids)
        if kind < 0.6:
            d = rng.randint(1, 12)
            ok = _write(db, "ten_seq", mid, limits, d)
            assert ok == (total + d <= limit), (step, total, d, limit)
            total += d if ok else 0
        elif kind < 0.9:
            d = -rng.randint(0, min(total, 10))
            assert _write(db, "ten_seq", mid, limits, d, checked=None)  # a forget: never refused
            total += d
        else:
            d = rng.randint(0, 3)
            assert _write(db, "ten_seq", mid, limits, d, checked=None)  # a retrain's growth: not checked
            total += d
        usage, _ = _state(db, "ten_seq")
        assert usage[1] == total, (step, usage, total)


def test_writes_to_models_of_other_shards_do_not_wait_for_each_other(db):
    """While one write of the tenant holds its shard (its transaction open), a write to a model of another shard
    commits without waiting for any lock (lock_timeout: a wait is an error, not a slow test)."""
    if db.is_sqlite:
        pytest.skip("SQLite has one writer at a time by design")
    _tenant(db, "ten_par")
    limits = {"models": None, "records": 10_000, "bytes": None}
    a, b = "mdl_a", next(f"mdl_{i}" for i in range(100) if usage_shards.shard_of(f"mdl_{i}")
                         != usage_shards.shard_of("mdl_a"))
    assert _write(db, "ten_par", a, limits, 1) and _write(db, "ten_par", b, limits, 1)  # both shards get a slice
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.write() as s:
            usage_shards.note(s, "ten_par", a, records=5)
            usage_shards.grow(s, "ten_par", limits, ("records",))
            holding.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert holding.wait(30)
        with db.write() as s:
            s.connection().execute(text("SET LOCAL lock_timeout = '2s'"))
            usage_shards.note(s, "ten_par", b, records=5)
            usage_shards.grow(s, "ten_par", limits, ("records",))
    finally:
        release.set()
        t.join()
    assert _state(db, "ten_par")[0][1] == 12


def test_migration_0019_upgrades_a_database_whose_tenants_have_models(tmp_path):
    """0018 -> 0019 on a populated SQLite database moves the counters into shard 0 in place (a copy-and-rename of
    ``tenants`` failed its foreign keys once models referenced it), and back down."""
    from alembic import command

    from app.config import Settings
    from app.db.migrate import alembic_config
    from app.main import create_app

    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(data_dir=data, log_level="WARNING")
    ctx = create_app(settings).state.ctx
    t = ctx.tenants.create_tenant("mig")["id"]
    ctx.models.create(t, {"name": "m", "algorithm": "exact_ridge", "loss": "squared", "dim": 2,
                          "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
                          "privacy": {"epsilon": 1.0, "delta": 1e-6}})
    ctx.db.dispose()
    cfg = alembic_config(f"sqlite:///{data / 'olu.db'}")
    command.downgrade(cfg, "0018")
    import sqlite3
    with sqlite3.connect(data / "olu.db") as conn:
        assert conn.execute("SELECT usage_models FROM tenants WHERE id = ?", (t,)).fetchone()[0] == 1
    create_app(settings).state.ctx.db.dispose()  # up again as a deployment does: at start-up, foreign keys on
    with sqlite3.connect(data / "olu.db") as conn:
        assert conn.execute("SELECT SUM(models) FROM tenant_usage_shards WHERE tenant_id = ?", (t,)).fetchone()[0] == 1
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
