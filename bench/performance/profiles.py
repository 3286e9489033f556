"""Profiles that explain the misses (saved under bench/results/):

- ``profile_learn_service.txt``: pyinstrument of ``ModelService.learn`` (in process, SQLite FULL, msgpack batches of
  1000 at d = 64) — where a batch's time goes once HTTP and JSON are out of the way;
- ``profile_forget_passive.txt``: pyinstrument of passive OLU ``forget(1)`` with the production noise source;
- the durable-commit floor: median time of the smallest write transaction (one UPDATE + COMMIT) on SQLite with
  synchronous=FULL and on PostgreSQL, i.e. what every learn/unlearn request pays at least.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path



def commit_floor(url: str | None, n: int = 50) -> float:
    from sqlalchemy import update

    from app.db.session import Database
    from app.db.migrate import upgrade_to_head
    from app.db.tables import Tenant
    from app.ids import utcnow

    tmp = tempfile.mkdtemp(prefix="olu-floor-")
    db = Database(url or f"sqlite:///{tmp}/floor.db", sqlite_synchronous="FULL")
    upgrade_to_head(db.engine)
    with db.write() as s:
        s.add(Tenant(id="ten_floor", name="f", record_key=b"k", log_size=0, created_at=utcnow()))
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        with db.write() as s:
            s.execute(update(Tenant).where(Tenant.id == "ten_floor").values(log_size=i))
        times.append(time.perf_counter() - t0)
    db.dispose()
    return statistics.median(times)


def learn_profile(results: Path, batches: int = 30) -> float:
    import msgpack
    from pyinstrument import Profiler

    from app.api.learn_body import parse_learn_body
    from app.config import Settings
    from app.main import create_app

    from ..common import stream

    tmp = tempfile.mkdtemp(prefix="olu-prof-")
    app = create_app(Settings(data_dir=Path(tmp), sqlite_synchronous="FULL", rate_limit=0, tenant_rate_limit=0))
    ctx = app.state.ctx
    t = ctx.tenants.create_tenant("p")
    m = ctx.models.create(t["id"], {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 64,
                                    "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.01,
                                    "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}})
    X, y = stream(1000 * (batches + 1), 64)
    bodies = [msgpack.packb({"ids": [f"r{k}-{i}" for i in range(1000)], "x": X[k * 1000:(k + 1) * 1000].tobytes(),
                             "y": y[k * 1000:(k + 1) * 1000].tobytes()}) for k in range(batches + 1)]
    b = parse_learn_body(bodies[0], "application/msgpack")
    ctx.models.learn(t["id"], m["id"], b.ids, b.X, b.y)  # warm-up (JIT, caches)
    times = []
    p = Profiler(interval=0.0005)
    p.start()
    for raw in bodies[1:]:
        t0 = time.perf_counter()
        b = parse_learn_body(raw, "application/msgpack")
        ctx.models.learn(t["id"], m["id"], b.ids, b.X, b.y)
        times.append(time.perf_counter() - t0)
    p.stop()
    (results / "profile_learn_service.txt").write_text(p.output_text(unicode=False, color=False))
    ctx.db.dispose()
    return statistics.median(times)


def forget_profile(results: Path) -> float:
    from pyinstrument import Profiler

    from app.unlearning import PassiveOLU

    from ..common import spec, stream

    e = PassiveOLU(spec("passive_olu", 16))
    X, y = stream(100_000, 16)
    e.learn(X, y)
    p = Profiler(interval=0.0001)
    p.start()
    t0 = time.perf_counter()
    for u in range(50_000, 52_000):
        e.forget([u])
    dt = (time.perf_counter() - t0) / 2000
    p.stop()
    (results / "profile_forget_passive.txt").write_text(p.output_text(unicode=False, color=False))
    return dt


def run(results: Path, pg_url: str | None) -> dict:
    out = {"commit_floor_sqlite_full_s": commit_floor(None)}
    if pg_url:
        out["commit_floor_postgresql_s"] = commit_floor(pg_url)
    out["service_learn_1000_inprocess_s"] = learn_profile(results)
    out["passive_forget_s"] = forget_profile(results)
    out["sqlite_insert_commit_1000_by_layout_s"] = schema_experiment()
    return out


def schema_experiment(batches: int = 30) -> dict:
    """SQLite (WAL, synchronous=FULL) insert + commit of 1000 records per transaction for the ``records`` layouts
    considered for the ingest target (raw sqlite3, no service code):

    - ``before_0006``: 64-char hex commitment, three indexes (unique (model, commitment), (tenant, commitment),
      (model, step)), the layout up to migration 0006;
    - ``lookup_0006``: the layout since migration 0006 (app/db/tables.py): hex commitment unindexed, one index on
      ``lookup`` (its first 8 bytes as a signed integer) and (model, step);
    - ``blob32``: the same with 32-byte binary commitments;
    - ``blob32_two_indexes``: binary commitments without the (tenant, commitment) index;
    - ``per_batch_row``: one row per batch holding the packed commitments (duplicate checks would then need a
      separate structure, e.g. a per-model hash set) — the floor of one small write per batch.
    """
    import hashlib
    import os
    import sqlite3

    layouts = {
        "before_0006": ("CREATE TABLE r (id INTEGER PRIMARY KEY, tenant_id TEXT, model_id TEXT, commitment TEXT, "
                        "step INTEGER, status TEXT, learned_at TEXT, forgotten_at TEXT, receipt_id TEXT, "
                        "lookup INTEGER); CREATE UNIQUE INDEX u ON r (model_id, commitment); "
                        "CREATE INDEX t ON r (tenant_id, commitment); CREATE INDEX s ON r (model_id, step);",
                        True, True),
        "lookup_0006": ("CREATE TABLE r (id INTEGER PRIMARY KEY, tenant_id TEXT, model_id TEXT, commitment TEXT, "
                        "step INTEGER, status TEXT, learned_at TEXT, forgotten_at TEXT, receipt_id TEXT, "
                        "lookup INTEGER); CREATE INDEX l ON r (lookup); CREATE INDEX s ON r (model_id, step);",
                        True, True),
        "blob32": ("CREATE TABLE r (id INTEGER PRIMARY KEY, tenant_id TEXT, model_id TEXT, commitment BLOB, "
                   "step INTEGER, status TEXT, learned_at TEXT, forgotten_at TEXT, receipt_id TEXT, lookup INTEGER);"
                   "CREATE UNIQUE INDEX u ON r (model_id, commitment); CREATE INDEX t ON r (tenant_id, commitment);"
                   "CREATE INDEX s ON r (model_id, step);", False, True),
        "blob32_two_indexes": ("CREATE TABLE r (id INTEGER PRIMARY KEY, tenant_id TEXT, model_id TEXT, "
                               "commitment BLOB, step INTEGER, status TEXT, learned_at TEXT, forgotten_at TEXT, "
                               "receipt_id TEXT, lookup INTEGER); CREATE UNIQUE INDEX u ON r (model_id, commitment);"
                               "CREATE INDEX s ON r (model_id, step);", False, True),
        "per_batch_row": ("CREATE TABLE r (id INTEGER PRIMARY KEY, model_id TEXT, first_step INTEGER, "
                          "commitments BLOB)", False, False),
    }
    out = {}
    for name, (ddl, hex_ids, per_row) in layouts.items():
        tmp = tempfile.mkdtemp(prefix="olu-schema-")
        con = sqlite3.connect(f"{tmp}/s.db", isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        con.executescript(ddl)
        times = []
        for b in range(batches):
            digests = [hashlib.sha256(os.urandom(16)).digest() for _ in range(1000)]
            t0 = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            if per_row:
                con.executemany("INSERT INTO r (tenant_id, model_id, commitment, step, status, learned_at, lookup) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                                [("ten_0123456789abcdef", "mdl_0123456789abcdef", d.hex() if hex_ids else d,
                                  b * 1000 + i, "learned", "2026-01-01 00:00:00.000000",
                                  int.from_bytes(d[:8], "big", signed=True)) for i, d in enumerate(digests)])
            else:
                con.execute("INSERT INTO r (model_id, first_step, commitments) VALUES (?, ?, ?)",
                            ("mdl_0123456789abcdef", b * 1000, b"".join(digests)))
            con.execute("COMMIT")
            times.append(time.perf_counter() - t0)
        con.close()
        out[name] = statistics.median(times[3:])
    return out
