"""Section 4: memory per model and per retained example.

- state blob: ``len(registry.dump(engine))`` after learning n examples (d = 64), i.e. the secret-state row;
- resident engine: bytes allocated (tracemalloc) while rebuilding the engine from that blob, i.e. what one cached
  engine costs in the per-process registry;
- database bytes per learned example: the service itself (in process, no HTTP) learns n examples in batches of
  1000 into a fresh database; bytes of each table (with its indexes) divided by n.  SQLite via the ``dbstat``
  virtual table, PostgreSQL via ``pg_total_relation_size``.
"""
from __future__ import annotations

import tempfile
import tracemalloc
from pathlib import Path

from app.db.state_codec import pack_state, unpack_state
from app.unlearning import ALGORITHMS

from ..common import spec, stream
from .forget import _hp, _learn

D = 64


def engine_sizes(n: int) -> dict:
    out = {}
    X, y = stream(n, D, seed=11)
    for algorithm, cls in ALGORITHMS.items():
        e, _ = _learn(algorithm, n, X, y)
        blob = pack_state(e.state())
        s = spec(algorithm, D, _hp(algorithm, n))
        state = unpack_state(blob)
        tracemalloc.start()
        engine = cls.from_state(s, state)
        resident, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del engine
        out[algorithm] = {"n": n, "state_blob_bytes": len(blob), "resident_bytes": resident}
    return out


def _db_bytes(db) -> dict[str, int]:
    from sqlalchemy import text

    with db.engine.connect() as c:
        if db.is_sqlite:
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            rows = c.execute(text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")).all()
            idx = dict(c.execute(text("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'")).all())
            out: dict[str, int] = {}
            for name, size in rows:
                table = idx.get(name, name)
                out[table] = out.get(table, 0) + int(size)
            return out
        rows = c.execute(text("SELECT relname, pg_total_relation_size(c.oid) FROM pg_class c "
                              "JOIN pg_namespace n ON n.oid = c.relnamespace "
                              "WHERE n.nspname = 'public' AND c.relkind = 'r'")).all()
        return {r[0]: int(r[1]) for r in rows}


ACTIVE_RECORDS = 4_000


def db_bytes(n: int, backends=("sqlite", "postgresql")) -> dict:
    from app.config import Settings
    from app.main import create_app

    from .ingest import _pg_database

    out: dict = {"n": n, "d": D, "backends": {}, "notes": []}
    X, y = stream(n, D, seed=12)
    for backend in backends:
        for algorithm in ("passive_olu", "active_olu"):
            # active_olu keeps its records under a cap (max_records) that the per-request work budget bounds
            # (about 5 000 at d = 64): it learns up to ACTIVE_RECORDS examples here, its row says how many
            k = min(n, ACTIVE_RECORDS) if algorithm == "active_olu" else n
            hyper = {"max_records": k} if algorithm == "active_olu" else {}
            tmp = tempfile.mkdtemp(prefix="olu-mem-")
            url, drop = None, None
            if backend == "postgresql":
                url, drop = _pg_database()
                if url is None:
                    out["notes"].append(drop)
                    break
            app = create_app(Settings(data_dir=Path(tmp), database_url=url, rate_limit=0, tenant_rate_limit=0))
            ctx = app.state.ctx
            try:
                t = ctx.tenants.create_tenant("mem")
                m = ctx.models.create(t["id"], {"name": "m", "algorithm": algorithm, "loss": "logistic", "dim": D,
                                                "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0,
                                                "l2": 0.01, "privacy": {"epsilon": 1.0, "delta": 1e-6},
                                                "hyperparameters": hyper})
                before = _db_bytes(ctx.db)
                for i in range(0, k, 1000):
                    ctx.models.learn(t["id"], m["id"], [f"record-{j:08d}" for j in range(i, min(k, i + 1000))],
                                     X[i:min(k, i + 1000)], y[i:min(k, i + 1000)])
                after = _db_bytes(ctx.db)
                per = {name: (after.get(name, 0) - before.get(name, 0)) / k for name in after
                       if after.get(name, 0) - before.get(name, 0) > 0}
                out["backends"].setdefault(backend, {})[algorithm] = {
                    "per_example_bytes": per, "total_per_example": sum(per.values()), "n": k}
            finally:
                ctx.db.dispose()
                if drop is not None:
                    drop()
    return out


def run(quick: bool, backends=("sqlite", "postgresql")) -> dict:
    n = 2_000 if quick else 20_000
    return {"engine": engine_sizes(n), "database": db_bytes(n, backends)}
