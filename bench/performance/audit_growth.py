"""What forgetting leaves for audit, and the allowance that bounds it (issue 37, F5-A), through HTTP.

    python -m bench.performance.audit_growth [sqlite|postgresql] [iterations] [batch]

The finding's client: one sequential client of a tenant under quotas of 2 models, 1 000 records and 2 MB doing
learn -> forget -> create -> delete (``batch`` records learned and forgotten per iteration).

- Phase 1, no audit quota (``audit_bytes`` 0): the database's growth per forgotten record (SQLite: pages in use x
  page size; PostgreSQL: ``pg_database_size``) beside what the service counts for it (``usage.audit_bytes``).
- Phase 2, a fresh tenant with ``audit_bytes`` = 1 MB: the iteration at which learns and creations are refused, and
  the database's growth over the ``iterations`` iterations after it (the target: none), every forget answering 200.

(``postgresql`` uses OLU_BENCH_POSTGRES_URL or postgresql+psycopg://postgres@127.0.0.1:5432/test to create and
drop a throwaway database.)  Nothing is asserted; tests/test_audit_growth.py checks the behaviour.
"""
from __future__ import annotations

import sys
import time

import httpx
import numpy as np
from sqlalchemy import text

from ..common import machine, passive_model
from .audit_export import _database, _serve

QUOTAS = {"models": 2, "records": 1000, "bytes": 2_000_000}


def _db_bytes(db) -> int:
    with db.engine.connect() as c:
        if db.is_sqlite:
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            used = c.exec_driver_sql("PRAGMA page_count").scalar() - c.exec_driver_sql("PRAGMA freelist_count").scalar()
            return int(used) * int(c.exec_driver_sql("PRAGMA page_size").scalar())
        return int(c.execute(text("SELECT pg_database_size(current_database())")).scalar())


def _churn(c: httpx.Client, mid: str, i: int, batch: int, X: np.ndarray) -> tuple[str, int, bool]:
    """One iteration: (the model now, records forgotten, whether the learn was accepted)."""
    ids = [f"r{i}-{j}" for j in range(batch)]
    r = c.post(f"/v1/models/{mid}/learn", json={"ids": ids, "x": X.tolist(), "y": [float(j % 2) for j in range(batch)]})
    forgotten = 0
    if r.status_code == 200:
        f = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids})
        if f.status_code != 200:
            raise RuntimeError(f"a forget was refused: {f.text}")
        forgotten = batch
    elif r.status_code != 409:
        raise RuntimeError(r.text)
    created = c.post("/v1/models", json=passive_model("churn", X.shape[1], 0.05))
    if created.status_code == 201:
        c.delete(f"/v1/models/{mid}").raise_for_status()
        mid = created.json()["id"]
    return mid, forgotten, r.status_code == 200


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "sqlite"
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    url, drop = _database(backend)
    server, base, token = _serve(url)
    db = server.config.app.state.ctx.db
    rng = np.random.default_rng(0)
    X = rng.normal(size=(batch, 4))
    X = 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)
    try:
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {token}"}, timeout=120) as admin:
            tenants = []
            for audit in (0, 1_000_000):
                t = admin.post("/v1/tenants", json={"name": f"churn-{audit}"}).json()
                admin.put(f"/v1/tenants/{t['id']}/quotas", json={**QUOTAS, "audit_bytes": audit}).raise_for_status()
                tenants.append(t["api_key"])
        # phase 1: bytes per forgotten record, measured and counted
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {tenants[0]}"}, timeout=120) as c:
            mid = c.post("/v1/models", json=passive_model("churn", 4, 0.05)).json()["id"]
            before, t0, forgotten = _db_bytes(db), time.perf_counter(), 0
            for i in range(iterations):
                mid, n, _ = _churn(c, mid, i, batch, X)
                forgotten += n
            seconds = time.perf_counter() - t0
            grown, counted = _db_bytes(db) - before, c.get("/v1/tenant").json()["usage"]["audit_bytes"]
        print(f"{machine().get('date_utc')} UTC, {backend}, {iterations} iterations of learn {batch} -> forget {batch} "
              f"-> create -> delete under quotas {QUOTAS}")
        print(f"no audit quota: the database grew {grown / 1e6:.2f} MB in {seconds:.1f} s ({grown / seconds * 3.6e3 / 1e9:.2f} "
              f"GB/h): {grown / forgotten:.0f} bytes per forgotten record; counted as audit: {counted / forgotten:.0f} "
              f"bytes per forgotten record (ratio measured / counted {grown / counted:.2f})")
        # phase 2: the allowance stops the growth
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {tenants[1]}"}, timeout=120) as c:
            mid = c.post("/v1/models", json=passive_model("churn", 4, 0.05)).json()["id"]
            refused_at, i, after_refusal = None, 0, None
            while refused_at is None or i < refused_at + iterations:
                mid, n, accepted = _churn(c, mid, 10_000 + i, batch, X)
                if not accepted and refused_at is None:
                    refused_at, after_refusal = i, _db_bytes(db)
                i += 1
                if refused_at is None and i > 10 * iterations:
                    break
            usage = c.get("/v1/tenant").json()["usage"]["audit_bytes"]
        if refused_at is None:
            print("audit quota 1 MB: never refused (raise the iterations)")
        else:
            print(f"audit quota 1 MB: learns and creations refused from iteration {refused_at} (audit usage "
                  f"{usage} bytes); the database grew {_db_bytes(db) - after_refusal} bytes over the {iterations} "
                  f"iterations after it; every forget answered 200")
    finally:
        server.should_exit = True
        time.sleep(0.5)
        drop()


if __name__ == "__main__":
    main()
