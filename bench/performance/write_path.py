"""Before/after of the service write path, in process (no HTTP): median ``ModelService.learn`` of 1000 examples
(d = 64) and ``unlearn`` of 1 record, on a fresh SQLite (synchronous=FULL) or PostgreSQL database.

Run it as a script against any checkout, e.g. to compare two branches interleaved:

    PYTHONPATH=/path/to/main   python bench/performance/write_path.py sqlite
    PYTHONPATH=/path/to/branch python bench/performance/write_path.py sqlite

A third argument names another family (e.g. ``memory_pair``, a data-holding one: its forget also erases the
retained example, its sealed row and data key, and checkpoints the WAL); a fourth, the number of unlearns (100);
a fifth, the hyperparameters as JSON (e.g. '{"capacity": 60}').

(``postgresql`` uses OLU_BENCH_POSTGRES_URL or postgresql+psycopg://postgres@127.0.0.1:5432/test to create and
drop a throwaway database.)  It imports only ``app``, so it runs against checkouts that predate ``bench``.
"""
from __future__ import annotations

import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "sqlite"
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 31
    algorithm = sys.argv[3] if len(sys.argv) > 3 else "passive_olu"
    forgets = int(sys.argv[4]) if len(sys.argv) > 4 else 100
    hyperparameters = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    import app as app_pkg
    from app.config import Settings
    from app.main import create_app

    url, drop = None, None
    if backend == "postgresql":
        from sqlalchemy import create_engine, text

        admin_url = os.environ.get("OLU_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
        name = "olu_wp_" + secrets.token_hex(4)
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        url = admin_url.rsplit("/", 1)[0] + "/" + name

        def _drop():
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()

        drop = _drop

    application = create_app(Settings(data_dir=Path(tempfile.mkdtemp()), database_url=url,
                                      sqlite_synchronous="FULL", log_level="WARNING"))
    ctx = application.state.ctx
    try:
        t = ctx.tenants.create_tenant("wp")
        m = ctx.models.create(t["id"], {"name": "m", "algorithm": algorithm, "loss": "logistic", "dim": 64,
                                        "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.01,
                                        "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": hyperparameters})
        rng = np.random.default_rng(0)
        X = rng.standard_normal((1000 * batches, 64))
        X *= 0.95 / np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
        y = (X @ rng.standard_normal(64) > 0).astype(float)
        learn = []
        for k in range(batches):
            ids = [f"r{k}-{i}" for i in range(1000)]
            t0 = time.perf_counter()
            ctx.models.learn(t["id"], m["id"], ids, X[k * 1000:(k + 1) * 1000], y[k * 1000:(k + 1) * 1000])
            learn.append(time.perf_counter() - t0)
        unlearn = []
        for i in range(forgets):
            t0 = time.perf_counter()
            ctx.models.unlearn(t["id"], m["id"], [f"r0-{i}"])
            unlearn.append(time.perf_counter() - t0)
        print(f"{os.path.dirname(app_pkg.__file__)} {backend} {algorithm}: learn(1000) median {statistics.median(learn[1:]) * 1e3:.1f} ms "
              f"(last 10: {statistics.median(learn[-10:]) * 1e3:.1f} ms), unlearn(1) median "
              f"{statistics.median(unlearn[min(5, forgets // 4):]) * 1e3:.2f} ms")
    finally:
        ctx.db.dispose()
        if drop is not None:
            drop()


if __name__ == "__main__":
    main()
