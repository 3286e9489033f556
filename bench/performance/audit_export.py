"""Audit reads as the log grows (issue 37, F5-H): exporting a model's deletion bundle and fetching one receipt with
its proof, through HTTP, for a model with 2 000 and one with 10 000 receipts in the same tenant's log.

    python -m bench.performance.audit_export [sqlite|postgresql] [small] [large] [repeats]

Target: the 10 000-receipt export takes at most 5x the 2 000-receipt one (linear; it was quadratic: 0.66 s for
1 000, 70.6 s for 10 000).  Prints the median of ``repeats`` interleaved exports of each (the whole bundle, streamed:
``GET /v1/audit/export?model_id=``), the same paged (``limit=1000``, following ``next_cursor``), the ratio, and the
median time of ``GET /v1/receipts/{id}`` (receipt + O(log n) proof) at both log sizes.  (``postgresql`` uses
OLU_BENCH_POSTGRES_URL or postgresql+psycopg://postgres@127.0.0.1:5432/test to create and drop a throwaway
database.)  Nothing is asserted: the numbers depend on the machine and its load.
"""
from __future__ import annotations

import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from ..common import free_port, machine, passive_model


def _database(backend: str):
    """(url or None for the SQLite default, drop callback)."""
    if backend != "postgresql":
        return None, lambda: None
    from sqlalchemy import create_engine, text

    admin_url = os.environ.get("OLU_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    name = "olu_ae_" + secrets.token_hex(4)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop():
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return admin_url.rsplit("/", 1)[0] + "/" + name, drop


def _serve(url: str | None):
    import uvicorn

    from app.config import Settings
    from app.main import create_app

    token = secrets.token_urlsafe(32)
    app = create_app(Settings(data_dir=Path(tempfile.mkdtemp()), database_url=url, admin_token=token,
                              log_level="WARNING", max_batch=10_000, tenant_rate_limit=0, tenant_max_in_flight=0,
                              tenant_compute_share=0, rate_limit=0))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}", token


def _model_with_receipts(c: httpx.Client, n: int, dim: int = 4) -> tuple[str, str]:
    """A passive_olu model that learned and then forgot ``n`` records (requests of 1 000); (model id, a receipt id)."""
    mid = c.post("/v1/models", json=passive_model(f"export-{n}", dim, 0.05)).json()["id"]
    rng = np.random.default_rng(n)
    X = rng.normal(size=(n, dim))
    X = 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)
    for a in range(0, n, 5000):
        part = X[a:a + 5000]
        r = c.post(f"/v1/models/{mid}/learn", json={"ids": [f"r{a + i}" for i in range(len(part))],
                                                    "x": part.tolist(), "y": [float(i % 2) for i in range(len(part))]})
        r.raise_for_status()
    receipt = None
    for a in range(0, n, 1000):
        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"r{i}" for i in range(a, min(n, a + 1000))]})
        r.raise_for_status()
        receipt = receipt or r.json()["receipts"][0]["id"]
    return mid, receipt


def _export(c: httpx.Client, mid: str, limit: int | None) -> int:
    if limit is None:
        r = c.get("/v1/audit/export", params={"model_id": mid})
        r.raise_for_status()
        return len(r.json()["receipts"])
    got, cursor = 0, None
    while True:
        r = c.get("/v1/audit/export", params={"model_id": mid, "limit": limit, **({"cursor": cursor} if cursor else {})})
        r.raise_for_status()
        got += len(r.json()["receipts"])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return got


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "sqlite"
    small = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    large = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    url, drop = _database(backend)
    server, base, token = _serve(url)
    try:
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {token}"}, timeout=600) as admin:
            key = admin.post("/v1/tenants", json={"name": "export"}).json()["api_key"]
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}, timeout=600) as c:
            t0 = time.perf_counter()
            models = {n: _model_with_receipts(c, n) for n in (small, large)}
            print(f"built {small} + {large} receipts in {time.perf_counter() - t0:.1f} s ({backend})")
            times: dict[tuple[int, str], list[float]] = {}
            for _ in range(repeats):  # interleaved: the two sizes see the same machine load
                for n, (mid, rid) in models.items():
                    for how, limit in (("whole", None), ("paged", 1000)):
                        t = time.perf_counter()
                        assert _export(c, mid, limit) == n
                        times.setdefault((n, how), []).append(time.perf_counter() - t)
                    t = time.perf_counter()
                    for _ in range(20):
                        c.get(f"/v1/receipts/{rid}").raise_for_status()
                    times.setdefault((n, "receipt"), []).append((time.perf_counter() - t) / 20)
    finally:
        server.should_exit = True
        time.sleep(0.5)
        drop()
    med = {k: statistics.median(v) for k, v in times.items()}
    m = machine()
    print(f"{m.get('date_utc')} UTC, {m.get('nproc')} cores, load {m.get('load_avg')}; medians of {repeats}")
    for how in ("whole", "paged"):
        ratio = med[(large, how)] / med[(small, how)]
        print(f"export {how:>5}: {small} receipts {med[(small, how)]:.3f} s, {large} receipts "
              f"{med[(large, how)]:.3f} s, ratio {ratio:.2f} (target <= {large / small:.0f}: linear)")
    print(f"GET /v1/receipts/{{id}} with its proof: {1e3 * med[(small, 'receipt')]:.1f} ms at log size {small}, "
          f"{1e3 * med[(large, 'receipt')]:.1f} ms at log size {small + large}")


if __name__ == "__main__":
    main()
