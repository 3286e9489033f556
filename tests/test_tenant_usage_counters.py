"""The tenant's usage counters (issue 32, in shards since issue 37 item 6: ``tenant_usage_shards``, kept by
every write as a delta in its own transaction) always equal the sums over the tenant's live models, after a seeded
random sequence of creations, learns, unlearns, retrains, refused writes and deletions, and after the tenant's
deletion; the usage shown on the tenant is those counters.  SQLite and, with OLU_TEST_POSTGRES_URL, PostgreSQL."""
from __future__ import annotations

import random

from sqlalchemy import func, select

from app.db import usage_shards
from app.db.tables import Model
from tests.helpers import create_model, examples, unit_rows


def _sums(server, tenant_id: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(the tenant's counters summed over its shards, sums over its live models)."""
    with server.app.state.ctx.db.read() as s:
        counters = usage_shards.usage(s.connection(), tenant_id)
        sums = s.execute(select(func.count(), func.coalesce(func.sum(Model.n_records - Model.n_forgotten), 0),
                                func.coalesce(func.sum(Model.bytes_stored), 0))
                         .where(Model.tenant_id == tenant_id, Model.status != "deleted")).one()
    return tuple(int(v) for v in counters), tuple(int(v) for v in sums)


def _check(server, c, tenant_id: str, what: str) -> tuple[int, int, int]:
    counters, sums = _sums(server, tenant_id)
    assert counters == sums, (what, counters, sums)
    usage = c.get("/v1/tenant").json()["usage"]
    assert (usage["models"], usage["records"], usage["bytes"]) == counters, (what, usage, counters)
    return counters


def test_counters_equal_the_sums_after_random_writes(server, tenant):
    tenant_id, c = tenant
    rng = random.Random(32)
    with server.admin() as a:
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"models": 4, "records": 120}).status_code == 200
    models: dict[str, dict] = {}  # id -> {"held": [record ids], "next": int, "algorithm": str}
    refused = 0
    for i in range(40):
        op = rng.choice(["create", "learn", "learn", "learn", "unlearn", "unlearn", "retrain", "delete"])
        if op == "create" or not models:
            algorithm = rng.choice(["passive_olu", "retrain", "memory_pair"])
            extra = {"hyperparameters": {"capacity": 2}} if algorithm == "memory_pair" else {}
            before = _check(server, c, tenant_id, f"{i} before create")
            if len(models) >= 4:  # refused by the models quota: nothing changes
                r = c.post("/v1/models", json={"name": "m", "algorithm": algorithm, "loss": "logistic", "dim": 4,
                                               "bounds": {"x_norm": 1.0}, "domain_radius": 10.0, "l2": 0.05,
                                               "privacy": {"epsilon": 1.0, "delta": 1e-6}, **extra})
                assert r.status_code == 409 and r.json()["quota"] == "models", r.text
                assert _check(server, c, tenant_id, f"{i} refused create") == before
                refused += 1
                continue
            mid = create_model(c, algorithm=algorithm, **extra)["id"]
            models[mid] = {"held": [], "next": 0, "algorithm": algorithm}
        elif op == "learn":
            mid = rng.choice(list(models))
            m = models[mid]
            n = rng.randint(1, 15)
            before = _check(server, c, tenant_id, f"{i} before learn")
            if m["held"] and rng.random() < 0.2:  # a duplicate record id: refused, nothing changes
                body = examples(unit_rows(1, 4, seed=i))
                body[0]["id"] = m["held"][0]
                r = c.post(f"/v1/models/{mid}/learn", json={"examples": body})
                assert r.status_code == 409, r.text
                assert _check(server, c, tenant_id, f"{i} refused learn") == before
                refused += 1
                continue
            r = c.post(f"/v1/models/{mid}/learn",
                       json={"examples": examples(unit_rows(n, 4, seed=i), prefix=mid, start=m["next"])})
            if before[1] + n > 120:  # past the records quota: refused whole
                assert r.status_code == 409 and r.json()["quota"] == "records", r.text
                assert _check(server, c, tenant_id, f"{i} refused learn") == before
                refused += 1
                continue
            assert r.status_code == 200, r.text
            m["held"] += [f"{mid}-{m['next'] + k}" for k in range(n)]
            m["next"] += n
        elif op == "unlearn":
            mid = rng.choice(list(models))
            m = models[mid]
            if not m["held"]:
                continue
            ids = rng.sample(m["held"], min(len(m["held"]), rng.randint(1, 3)))
            r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids})
            if r.status_code == 200:
                m["held"] = [x for x in m["held"] if x not in ids]
            else:  # a memory pair's capacity spent: retrain_required, records kept
                assert r.status_code == 409, r.text
        elif op == "retrain":
            mid = rng.choice(list(models))
            r = c.post(f"/v1/models/{mid}/retrain")
            assert r.status_code in (200, 409), r.text
        else:
            mid = rng.choice(list(models))
            assert c.delete(f"/v1/models/{mid}").status_code == 204
            del models[mid]
        counters = _check(server, c, tenant_id, f"{i} {op}")
        assert counters[:2] == (len(models), sum(len(m["held"]) for m in models.values())), (i, op, counters)
    assert refused > 0
    with server.admin() as a:
        assert a.delete(f"/v1/tenants/{tenant_id}").status_code == 200
    counters, sums = _sums(server, tenant_id)
    assert counters == sums == (0, 0, 0)


def _backfill(url: str) -> None:
    from alembic import command
    from sqlalchemy import create_engine, text

    from app.db.migrate import alembic_config

    cfg = alembic_config(url)
    command.upgrade(cfg, "0013")
    eng = create_engine(url)
    now = "2026-11-28 00:00:00+00:00"
    with eng.begin() as conn:
        for t in ("ten_a", "ten_b", "ten_c"):
            conn.execute(text("INSERT INTO tenants (id, name, record_key, log_size, created_at) "
                              "VALUES (:t, 'n', :k, 0, :now)"), {"t": t, "k": b"k", "now": now})
        for mid, t, n, f, b, status in (("m1", "ten_a", 10, 3, 1000, "ready"), ("m2", "ten_a", 5, 0, 200, "ready"),
                                        ("m3", "ten_a", 50, 0, 9000, "deleted"), ("m4", "ten_b", 7, 7, 64, "ready")):
            conn.execute(text(
                "INSERT INTO models (id, tenant_id, name, algorithm, spec_json, status, step, n_records, n_forgotten, "
                "version, epoch, rho_spent, ledger_json, constants_json, guarantee_json, created_at, updated_at, "
                "bytes_stored) VALUES (:m, :t, 'm', 'passive_olu', '{}', :s, :n, :n, :f, 1, 1, 0, '{}', '{}', '{}', "
                ":now, :now, :b)"), {"m": mid, "t": t, "s": status, "n": n, "f": f, "b": b, "now": now})
    command.upgrade(cfg, "head")
    with eng.connect() as conn:
        got = {r[0]: tuple(r[1:]) for r in conn.execute(text(
            "SELECT tenant_id, SUM(models), SUM(records), SUM(bytes) FROM tenant_usage_shards GROUP BY tenant_id"))}
    eng.dispose()
    assert got == {"ten_a": (2, 12, 1200), "ten_b": (1, 0, 64), "ten_c": (0, 0, 0)}, got


def test_migration_backfills_the_counters_from_the_live_models_sqlite(tmp_path):
    _backfill(f"sqlite:///{tmp_path / 'm.db'}")


def test_migration_backfills_the_counters_from_the_live_models_postgresql(postgres_url):
    import secrets

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(postgres_url)  # the session's database is at head and in use: migrate a fresh one
    name = f"{base.database}_m{secrets.token_hex(3)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        _backfill(base.set(database=name).render_as_string(hide_password=False))
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
