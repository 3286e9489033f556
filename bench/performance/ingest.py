"""Section 2: service ingest over HTTP and request latencies (real uvicorn subprocess, loopback, httpx).

For each database (SQLite with OLU_SQLITE_SYNCHRONOUS=FULL, i.e. fsync on every commit; PostgreSQL when a server
answers) the service is started with ``python -m uvicorn app.main:app`` (one worker), a passive OLU logistic model
with d = 64 is created, and batches of 1, 100 and 1000 examples are posted in three body shapes: per-example JSON,
columnar JSON and msgpack with raw float64 bytes (one model per shape).  Bodies are encoded before the clock starts.
The ceiling is a bare FastAPI app (bench/performance/bare_app.py) that only parses and validates the per-example body with
pydantic, served the same way.  All servers run at once and the requests alternate between them (round robin,
one client connection per server, one request in flight), so a change of load on the shared machine hits every
target alike; the rate is batch / median request time.  On SQLite, ``families_1000``: exact_ridge against
passive_olu, requests of 1000 alternating between the two models (``family_ingest``).  Latencies: predict (1 row), learn (1 example), unlearn (1 record, signed receipt, commit).
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from ..common import NO_RATE_LIMITS, free_port, stream

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("OLU_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
D = 64


class Server:
    def __init__(self, target: str, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env={**os.environ, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(self.url + "/healthz" if "app.main" in target else self.url + "/docs").status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server {target} did not start: {self.log.read()[-2000:].decode(errors='replace')}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _pg_database():
    """A throwaway PostgreSQL database (URL, drop function) or (None, reason)."""
    try:
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        base = make_url(PG_ADMIN)
        name = f"olu_bench_{os.getpid()}_{secrets.token_hex(3)}"
        admin = create_engine(base, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as e:  # noqa: BLE001
        return None, f"PostgreSQL not usable at {PG_ADMIN}: {type(e).__name__}"

    def drop():
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return base.set(database=name).render_as_string(hide_password=False), drop


def _bodies(shape: str, X: np.ndarray, y: np.ndarray, prefix: str) -> tuple[bytes, str]:
    ids = [f"{prefix}-{i}" for i in range(len(X))]
    if shape == "examples":
        return orjson.dumps({"examples": [{"id": i, "x": x, "y": v} for i, x, v in zip(ids, X.tolist(), y.tolist())]}), \
            "application/json"
    if shape == "columnar":
        return orjson.dumps({"ids": ids, "x": X.tolist(), "y": y.tolist()}), "application/json"
    import msgpack

    return msgpack.packb({"ids": ids, "x": np.ascontiguousarray(X, "<f8").tobytes(),
                          "y": np.ascontiguousarray(y, "<f8").tobytes()}), "application/msgpack"


def _post_all(client: httpx.Client, url: str, bodies: list[tuple[bytes, str]]) -> list[float]:
    times = []
    for raw, ctype in bodies:
        t0 = time.perf_counter()
        r = client.post(url, content=raw, headers={"content-type": ctype})
        times.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {r.text[:300]}")
    return times


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _requests_for(batch: int, quick: bool) -> int:
    return {1: 40 if quick else 300, 100: 10 if quick else 60, 1000: 5 if quick else 50}[batch]


def ingest(targets: list[dict], quick: bool) -> dict:
    """Round-robin over every (server, body shape) target, request by request, so that a load change on the
    machine hits all of them alike and the ratios stay meaningful."""
    out: dict = {}
    clients = {t["name"]: httpx.Client(base_url=t["url"], headers=t["headers"], timeout=120) for t in targets}
    try:
        for batch in (1, 100, 1000):
            nreq = _requests_for(batch, quick)
            X, y = stream(batch * (nreq + 2), D, seed=batch)
            plan = {}
            for t in targets:
                path = t["learn_path"](clients[t["name"]])
                plan[(t["name"], t["shape"])] = (path, [
                    _bodies(t["shape"], X[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch],
                            f"{t['shape']}-{batch}-{k}-{secrets.token_hex(3)}") for k in range(nreq + 2)])
            times: dict = {key: [] for key in plan}
            for k in range(nreq + 2):
                for t in targets:
                    key = (t["name"], t["shape"])
                    path, bodies = plan[key]
                    dt = _post_all(clients[t["name"]], path, [bodies[k]])[0]
                    if k >= 2:  # the first two are warm-up (connection, caches, JIT)
                        times[key].append(dt)
            for (name, shape), ts in times.items():
                out.setdefault(name, {})[f"{shape}/{batch}"] = {
                    "batch": batch, "shape": shape, "requests": nreq, "p50_s": statistics.median(ts),
                    "p99_s": _pct(ts, 99), "events_per_s": batch / statistics.median(ts),
                    "body_bytes": len(plan[(name, shape)][1][2][0])}
    finally:
        for c in clients.values():
            c.close()
    return out


def _service_model(url: str, admin_token: str) -> tuple[str, str]:
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/tenants", json={"name": "bench"}, headers={"authorization": f"Bearer {admin_token}"})
        r.raise_for_status()
        key = r.json()["api_key"]
        return key, key


def _new_model(c: httpx.Client) -> str:
    r = c.post("/v1/models", json={"name": "bench", "algorithm": "passive_olu", "loss": "logistic", "dim": D,
                                   "bounds": {"x_norm": 1.0}, "domain_radius": 10.0, "l2": 0.01,
                                   "privacy": {"epsilon": 1.0, "delta": 1e-6}})
    r.raise_for_status()
    return r.json()["id"]


def family_ingest(url: str, key: str, quick: bool) -> dict:
    """exact_ridge (2 classes, least squares) against passive_olu (logistic) through one service: learn requests of
    1000 records at d = 64 (msgpack bodies), the two models alternating request by request; events/s = 1000 /
    median request time."""
    nreq = 10 if quick else 50
    X, y = stream(1000 * (nreq + 2), D, seed=1000)
    bodies = [_bodies("msgpack", X[k * 1000:(k + 1) * 1000], y[k * 1000:(k + 1) * 1000], f"fam-{k}")
              for k in range(nreq + 2)]
    specs = {"passive_olu": {"algorithm": "passive_olu", "loss": "logistic"},
             "exact_ridge": {"algorithm": "exact_ridge", "loss": "squared", "n_classes": 2}}
    times: dict = {name: [] for name in specs}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=120) as c:
        paths = {}
        for name, sp in specs.items():
            r = c.post("/v1/models", json={"name": f"bench-{name}", **sp, "dim": D, "bounds": {"x_norm": 1.0},
                                           "domain_radius": 10.0, "l2": 0.01,
                                           "privacy": {"epsilon": 1.0, "delta": 1e-6}})
            r.raise_for_status()
            paths[name] = f"/v1/models/{r.json()['id']}/learn"
        for k in range(nreq + 2):
            for name in specs:
                dt = _post_all(c, paths[name], [bodies[k]])[0]
                if k >= 2:  # warm-up
                    times[name].append(dt)
    rates = {name: 1000 / statistics.median(ts) for name, ts in times.items()}
    return {"batch": 1000, "requests": nreq, "shape": "msgpack", "events_per_s": rates,
            "ratio": rates["exact_ridge"] / rates["passive_olu"]}


def latencies(url: str, key: str, quick: bool) -> dict:
    n = 40 if quick else 300
    out = {}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
        mid = _new_model(c)
        X, y = stream(n + 1010, D, seed=7)
        raw, ctype = _bodies("columnar", X[:1000], y[:1000], "held")
        c.post(f"/v1/models/{mid}/learn", content=raw, headers={"content-type": ctype}).raise_for_status()
        ops = {
            "predict": [(f"/v1/models/{mid}/predict", orjson.dumps({"x": [X[i].tolist()]})) for i in range(n + 5)],
            "learn(1)": [(f"/v1/models/{mid}/learn", orjson.dumps({"examples": [
                {"id": f"one-{i}", "x": X[1000 + i].tolist(), "y": float(y[1000 + i])}]})) for i in range(n + 5)],
            "unlearn(1)": [(f"/v1/models/{mid}/unlearn", orjson.dumps({"ids": [f"held-{i}"]})) for i in range(n + 5)],
        }
        for name, reqs in ops.items():
            times = []
            for k, (path, body) in enumerate(reqs):
                t0 = time.perf_counter()
                r = c.post(path, content=body, headers={"content-type": "application/json"})
                dt = time.perf_counter() - t0
                if r.status_code != 200:
                    raise RuntimeError(f"{name}: {r.status_code} {r.text[:300]}")
                if k >= 5:
                    times.append(dt)
            out[name] = {"p50_s": statistics.median(times), "p99_s": _pct(times, 99), "n": len(times)}
    return out


def run(quick: bool, backends: tuple[str, ...] = ("sqlite", "postgresql"), profile: bool = False,
        results_dir: Path | None = None) -> dict:
    result: dict = {"d": D, "backends": {}, "notes": [],
                    "method": "all servers up at once; requests alternate between them (round robin)"}
    servers, drops, tmps = [], [], []
    try:
        bare = Server("bench.performance.bare_app:app")
        servers.append(bare)
        targets = [{"name": "bare", "shape": "examples", "url": bare.url, "headers": {},
                    "learn_path": lambda c: "/learn"}]
        services = {}
        for backend in backends:
            tmp = tempfile.mkdtemp(prefix="olu-bench-")
            tmps.append(tmp)
            admin = "bench-" + secrets.token_hex(16)
            env = {"OLU_DATA_DIR": tmp, "OLU_ADMIN_TOKEN": admin, "OLU_SQLITE_SYNCHRONOUS": "FULL",
                   "OLU_LOG_LEVEL": "WARNING",
                   **NO_RATE_LIMITS}
            if backend == "postgresql":
                pg_url, drop = _pg_database()
                if pg_url is None:
                    result["notes"].append(drop)
                    continue
                drops.append(drop)
                env["OLU_DATABASE_URL"] = pg_url
            srv = Server("app.main:app", env)
            servers.append(srv)
            key, _ = _service_model(srv.url, admin)
            services[backend] = (srv, key)
            for shape in ("examples", "columnar", "msgpack"):
                def learn_path(c, memo={}):
                    if "mid" not in memo:
                        memo["mid"] = _new_model(c)  # one model per (backend, shape)
                    return f"/v1/models/{memo['mid']}/learn"

                targets.append({"name": backend, "shape": shape, "url": srv.url,
                                "headers": {"authorization": f"Bearer {key}"}, "learn_path": learn_path})
        spies = []
        if profile and results_dir is not None and shutil.which("py-spy"):
            for backend, (srv, _) in services.items():
                out = results_dir / f"profile_service_{backend}.raw"  # collapsed stacks; summarised below
                spies.append(subprocess.Popen(["py-spy", "record", "--pid", str(srv.proc.pid), "--format", "raw",
                                               "--rate", "200", "--output", str(out)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        ing = ingest(targets, quick)
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        if spies:
            from .profile_summary import summarise

            for backend in services:
                raw = results_dir / f"profile_service_{backend}.raw"
                if raw.exists():
                    (results_dir / f"profile_service_{backend}_summary.txt").write_text(summarise(raw, top=40) + "\n")
        result["bare_fastapi"] = ing.pop("bare")
        for backend, (srv, key) in services.items():
            result["backends"][backend] = {"ingest": ing[backend], "latency": latencies(srv.url, key, quick)}
            if backend == "sqlite":
                result["backends"][backend]["families_1000"] = family_ingest(srv.url, key, quick)
    finally:
        for srv in servers:
            srv.stop()
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
        for drop in drops:
            drop()
    ceiling = result["bare_fastapi"]["examples/1000"]["events_per_s"]
    for backend, b in result["backends"].items():
        for row in b["ingest"].values():
            base = result["bare_fastapi"].get(f"examples/{row['batch']}")
            row["ratio_vs_bare"] = row["events_per_s"] / base["events_per_s"] if base else None
        best = max(v["events_per_s"] for v in b["ingest"].values() if v["batch"] == 1000)
        b["best_1000_ratio_vs_bare"] = best / ceiling
    return result
