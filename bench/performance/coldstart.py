"""First-request latency after a cold start (issue 23): ``python -m bench --sections coldstart``.

A service process is started on an empty ``NUMBA_CACHE_DIR`` (as a fresh install, or an image built without
``olu warm``), and timed: until ``/healthz`` answers, then (right away, as a client that does not wait for
readiness) the first learn of 1 000 examples (d = 16, passive OLU), the first unlearn, the next learn; then until
``/readyz`` answers 200 (503 while the kernels compile in the background).  The
same process is started again on the cache it has just filled (a warm start: ``olu warm`` ahead, or the image),
which is the baseline of the ratios.  Before issue 23 the first learn waited for the compilation (82 s on one core).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from ..common import free_port, passive_model, wait_for

ROOT = Path(__file__).resolve().parents[2]
N, DIM = 1000, 16
MODEL = passive_model("cold", DIM, 0.05)


def _rows(prefix: str, seed: int) -> list[dict]:
    X = np.random.default_rng(seed).standard_normal((N, DIM))
    X = 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)
    return [{"id": f"{prefix}{i}", "x": x.tolist(), "y": float(i % 2)} for i, x in enumerate(X)]


def _start(cache: Path, work: Path) -> dict:
    admin, port = "bench-admin-" + secrets.token_hex(16), free_port()
    data = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "OLU_DATA_DIR": str(data), "OLU_ADMIN_TOKEN": admin, "NUMBA_CACHE_DIR": str(cache)}
    env.pop("OLU_DATABASE_URL", None)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port),
                             "--log-level", "warning"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url, out = f"http://127.0.0.1:{port}", {}
    try:
        wait_for(url, proc, "/healthz", poll=0.02)
        out["alive_s"] = time.perf_counter() - started  # /healthz; the first requests go now, not after /readyz
        with httpx.Client(base_url=url, timeout=600) as c:
            key = c.post("/v1/tenants", json={"name": "b"}, headers={"authorization": f"Bearer {admin}"}).json()
            c.headers["authorization"] = f"Bearer {key['api_key']}"
            mid = c.post("/v1/models", json=MODEL).json()["id"]
            out["kernels_at_first_learn"] = c.get("/readyz").json()["checks"]["kernels"]
            for name, call in (("first_learn_s", lambda: c.post(f"/v1/models/{mid}/learn",
                                                                json={"examples": _rows("a", 1)})),
                               ("first_unlearn_s", lambda: c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["a3"]})),
                               ("next_learn_s", lambda: c.post(f"/v1/models/{mid}/learn",
                                                               json={"examples": _rows("b", 2)}))):
                t0 = time.perf_counter()
                r = call()
                out[name] = time.perf_counter() - t0
                assert r.status_code == 200, r.text
            while c.get("/readyz").status_code != 200:  # 503 while the kernels compile
                if time.perf_counter() - started > 900:
                    break
                time.sleep(0.25)
            out["ready_s"] = time.perf_counter() - started
            out["kernels"] = c.get("/readyz").json()["checks"]["kernels"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return out


def run(quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as work:
        cache = Path(work) / "numba-cache"
        cache.mkdir()
        cold = _start(cache, Path(work))   # fills the cache in the background, waited for at the end
        warm = _start(cache, Path(work))
    return {"n": N, "d": DIM, "cold": cold, "warm": warm, "cpus": os.cpu_count()}


def table(r: dict) -> list[str]:
    keys = ("alive_s", "first_learn_s", "first_unlearn_s", "next_learn_s", "ready_s")
    lines = [f"## cold start: a fresh service process, first requests (learn = {r['n']} examples, d = {r['d']}, "
             f"SQLite; {r['cpus']} cpus)",
             f"{'start':>6} {'kernels then':>13} " + " ".join(f"{k[:-2]:>16}" for k in keys)]
    for name in ("cold", "warm"):
        row = r[name]
        lines.append(f"{name:>6} {row['kernels_at_first_learn']:>13} " + " ".join(f"{row[k]:>15.3f}s" for k in keys))
    lines.append(f"{'cold/warm':>20} " + " ".join(f"{r['cold'][k] / r['warm'][k]:>15.1f}x" for k in keys))
    return lines
