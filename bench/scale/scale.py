"""Scaling (issue 23 item 4): ``python -m bench --sections scale``.

Aggregate learn events/s and predict requests/s against N = 1, 2, 4, 8 service processes:

* PostgreSQL: N replicas (separate uvicorn processes on their own ports, one database), the clients spread over
  them round robin -- the production topology without its proxy;
* SQLite: ``uvicorn --workers N`` on one port and one database file (what ``olu serve --workers N`` does).

The servers are pinned to the first N cores and the load generators (one process per client, one model per
client, msgpack batches of 1 000 examples at d = 64, then 1-row predicts) to the cores after them; the cores each
side saw are printed with the figures.  N stops where the servers and at least one generator core no longer fit,
so on this 2-core machine it is the small form, N = 1 with the generators on the other core (and N = 2 with the
generators sharing the cores, marked "shared": not a scaling figure).  Ratios are against N = 1 of the same backend
in the same run.  Targets (issue 23): PostgreSQL ingest >= 0.7 x N x one replica's up to the cores available;
SQLite learn p99 with several workers <= 2 x one worker's, or the docs steer SQLite users to one worker.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from ..common import free_port, passive_model, wait_for

ROOT = Path(__file__).resolve().parents[2]
D, BATCH = 64, 1000
MODEL = passive_model("scale", D, 0.01)


def _pin(cores: list[int]):
    return lambda: os.sched_setaffinity(0, cores)


class _Servers:
    """N replicas (one process each) or one uvicorn with N workers, pinned to ``cores``."""

    def __init__(self, database_url: str, n: int, cores: list[int], workers: bool, data_dir: Path):
        self.admin = "scale-admin-" + secrets.token_hex(16)
        env = {**os.environ, "OLU_DATABASE_URL": database_url, "OLU_DATA_DIR": str(data_dir),
               "OLU_ADMIN_TOKEN": self.admin, "OLU_RATE_LIMIT": "0", "OPENBLAS_NUM_THREADS": "1",
               # one tenant's clients measure the replicas' throughput: the per-tenant fair-share limits are off
               "OLU_TENANT_RATE_LIMIT": "0", "OLU_TENANT_MAX_IN_FLIGHT": "0", "OLU_TENANT_COMPUTE_SHARE": "0"}
        env.setdefault("OLU_SIGNING_KEY", _seed())
        self.procs, self.urls = [], []
        for i in range(1 if workers else n):
            port = free_port()
            cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--log-level", "warning",
                   "--no-access-log"] + (["--workers", str(n)] if workers else [])
            self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, preexec_fn=_pin(cores)))
            self.urls.append(f"http://127.0.0.1:{port}")
            wait_for(self.urls[-1], self.procs[-1])  # one at a time: the first one migrates the schema

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _seed() -> str:
    import base64

    return base64.b64encode(os.urandom(32)).decode()


def _client(args) -> dict:
    """One load generator: its own model on its replica; learns for ``seconds``, then predicts for ``seconds``."""
    url, key, mid, cores, seconds, seed = args
    if cores:
        os.sched_setaffinity(0, cores)
    import msgpack

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((BATCH, D))
    X = 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.random(BATCH) < 0.5).astype(float)
    xb, yb = np.ascontiguousarray(X, "<f8").tobytes(), y.tobytes()
    out = {"learn": [], "predict": []}
    with httpx.Client(base_url=url, timeout=120, headers={"authorization": f"Bearer {key}"}) as c:
        n, ends = 0, time.perf_counter() + seconds
        while time.perf_counter() < ends:
            body = msgpack.packb({"ids": [f"{seed}-{n}-{i}" for i in range(BATCH)], "x": xb, "y": yb})
            t0 = time.perf_counter()
            r = c.post(f"/v1/models/{mid}/learn", content=body, headers={"content-type": "application/msgpack"})
            out["learn"].append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"learn {r.status_code}: {r.text[:300]}")
            n += 1
        row = {"x": [X[0].tolist()]}
        ends = time.perf_counter() + seconds
        while time.perf_counter() < ends:
            t0 = time.perf_counter()
            r = c.post(f"/v1/models/{mid}/predict", json=row)
            out["predict"].append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"predict {r.status_code}: {r.text[:300]}")
    return out


def _measure(backend: str, database_url: str, n: int, server_cores: list[int], client_cores: list[int],
             clients: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        servers = _Servers(database_url, n, server_cores, workers=backend == "sqlite", data_dir=Path(tmp))
        try:
            url0 = servers.urls[0]
            with httpx.Client(base_url=url0, timeout=60) as c:
                key = c.post("/v1/tenants", json={"name": "scale"},
                             headers={"authorization": f"Bearer {servers.admin}"}).json()["api_key"]
                c.headers["authorization"] = f"Bearer {key}"
                mids = [c.post("/v1/models", json=MODEL).json()["id"] for _ in range(clients)]
            jobs = [(servers.urls[i % len(servers.urls)], key, mids[i], client_cores, seconds, i)
                    for i in range(clients)]
            with mp.get_context("fork").Pool(clients) as pool:
                results = pool.map(_client, jobs)
        finally:
            servers.stop()
    learn = [t for r in results for t in r["learn"]]
    predict = [t for r in results for t in r["predict"]]
    return {"backend": backend, "n": n, "server_cores": server_cores, "client_cores": client_cores or "shared",
            "clients": clients, "learn_events_per_s": len(learn) * BATCH / seconds,
            "learn_p50_s": float(np.percentile(learn, 50)), "learn_p99_s": float(np.percentile(learn, 99)),
            "predict_per_s": len(predict) / seconds, "predict_p99_s": float(np.percentile(predict, 99))}


def run(quick: bool = False, backends: tuple[str, ...] = ("sqlite", "postgresql"),
        seconds: float | None = None) -> dict:
    from ..performance.ingest import _pg_database

    cores = sorted(os.sched_getaffinity(0))
    seconds = seconds or (4.0 if quick else 15.0)
    rows, notes = [], []
    for backend in backends:
        for n in (1, 2, 4, 8):
            if n + 1 <= len(cores):
                server_cores, client_cores = cores[:n], cores[n:]
            elif n == 2 and len(cores) == 2:  # the small form's second point: everything on both cores
                server_cores, client_cores = cores, []
            else:
                break
            with tempfile.TemporaryDirectory() as tmp:
                drop = None
                if backend == "postgresql":  # a fresh database per point
                    db, drop = _pg_database()
                    if db is None:
                        notes.append(f"postgresql skipped: {drop}")
                        break
                else:
                    db = f"sqlite:///{Path(tmp) / 'olu.db'}"
                try:
                    rows.append(_measure(backend, db, n, server_cores, client_cores, clients=2 * n,
                                         seconds=seconds))
                finally:
                    if drop is not None:
                        drop()
    for r in rows:
        base = next(b for b in rows if b["backend"] == r["backend"] and b["n"] == 1)
        r["ingest_vs_one"] = r["learn_events_per_s"] / base["learn_events_per_s"]
        r["efficiency"] = r["ingest_vs_one"] / r["n"]
        r["learn_p99_vs_one"] = r["learn_p99_s"] / base["learn_p99_s"]
        r["predict_vs_one"] = r["predict_per_s"] / base["predict_per_s"]
    return {"cores": cores, "seconds": seconds, "batch": BATCH, "d": D, "rows": rows, "notes": notes}


def table(r: dict) -> list[str]:
    lines = [f"## scale: learn (msgpack batches of {r['batch']}, d = {r['d']}) then predict (1 row), "
             f"{r['seconds']:g} s each, one model per client; cores seen: {r['cores']}",
             f"{'backend':>10} {'N':>2} {'server cores':>13} {'client cores':>13} {'events/s':>9} {'x N=1':>6} "
             f"{'eff.':>5} {'learn p50':>9} {'learn p99':>9} {'p99 x1':>6} {'predict/s':>9} {'x N=1':>6}"]
    for row in r["rows"]:
        lines.append(f"{row['backend']:>10} {row['n']:>2} {str(row['server_cores']):>13} "
                     f"{str(row['client_cores']):>13} {row['learn_events_per_s']:>9.0f} {row['ingest_vs_one']:>5.2f}x "
                     f"{row['efficiency']:>5.2f} {row['learn_p50_s']:>8.3f}s {row['learn_p99_s']:>8.3f}s "
                     f"{row['learn_p99_vs_one']:>5.2f}x {row['predict_per_s']:>9.0f} {row['predict_vs_one']:>5.2f}x")
    lines += [f"note: {n}" for n in r["notes"]]
    if len(r["cores"]) < 3:
        lines.append("note: the small form (fewer than 3 cores): N = 2 shares its cores with the load generators, "
                     "so it is a contention figure, not a scaling one")
    return lines
