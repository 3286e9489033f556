"""Section stream: learn events through NATS JetStream (``olu consume``) against HTTP ingest, in the same run.

Per database (SQLite with fsync on every commit; PostgreSQL when a server answers) one API process
(``python -m uvicorn app.main:app``) and one consumer process (``python -m app.cli consume``) share the database;
a passive OLU logistic model with d = 64 per path.  Rounds alternate between the paths (so a load change on the
shared machine hits both alike) and the table gives medians over the rounds:

- broker: ``n`` learn events of one example each, published as fast as the client can (publish_async, acked by
  the stream), timed from the first publish until the consumer's last result arrived on the results subject;
- HTTP, 1 example per request, one request in flight (the same events without a broker);
- HTTP batch ingest, 100 examples per request (the batching clients do when they can).

Rates are examples per second.  The consumer batches consecutive learn events of a model into one transaction,
which is where it gains over one-request-per-event HTTP.  Needs NATS with JetStream at 127.0.0.1:4222.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from ..common import NO_RATE_LIMITS
from ..common import stream as make_stream
from .ingest import D, Server, _new_model, _pg_database

ROOT = Path(__file__).resolve().parents[2]
NATS = "nats://127.0.0.1:4222"
ADMIN = "bench-admin-" + secrets.token_hex(16)


def _nats_up() -> bool:
    try:
        import nats  # noqa: F401

        socket.create_connection(("127.0.0.1", 4222), timeout=2).close()
        return True
    except (ImportError, OSError):
        return False


async def _broker_round(tenant: str, mid: str, stream_name: str, X, y, start: int) -> float:
    """Publish len(X) one-example learn events; seconds until every result came back."""
    import nats

    nc = await nats.connect(NATS)
    js = nc.jetstream()
    done = asyncio.Event()
    n, got = len(X), 0

    async def on_result(_msg):
        nonlocal got
        got += 1
        if got >= n:
            done.set()

    sub = await nc.subscribe(f"olu.{tenant}.{mid}.results", cb=on_result)
    await nc.flush()
    bodies = [orjson.dumps({"id": f"b{start + i}", "kind": "learn",
                            "body": {"ids": [f"b{start + i}"], "x": [X[i].tolist()], "y": [float(y[i])]}})
              for i in range(n)]
    t0 = time.perf_counter()
    futures = [await js.publish_async(f"olu.{tenant}.{mid}.events", b, stream=stream_name) for b in bodies]
    await asyncio.gather(*futures)
    await asyncio.wait_for(done.wait(), timeout=600)
    dt = time.perf_counter() - t0
    await sub.unsubscribe()
    await nc.close()
    return dt


def _http_round(c: httpx.Client, mid: str, X, y, start: int, per_request: int) -> float:
    bodies = [orjson.dumps({"ids": [f"h{per_request}-{start + i + j}" for j in range(per_request)],
                            "x": X[i:i + per_request].tolist(), "y": y[i:i + per_request].tolist()})
              for i in range(0, len(X), per_request)]
    t0 = time.perf_counter()
    for b in bodies:
        r = c.post(f"/v1/models/{mid}/learn", content=b, headers={"content-type": "application/json"})
        if r.status_code != 200:
            raise RuntimeError(f"learn: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t0


async def _streams(action: str, name: str, tenant: str = "") -> None:
    import nats

    nc = await nats.connect(NATS)
    js = nc.jetstream()
    if action == "create":
        await js.add_stream(name=name, subjects=[f"olu.{tenant}.*.events"])
    else:
        try:
            await js.delete_stream(name)
        except Exception:  # noqa: BLE001
            pass
    await nc.close()


def _backend(name: str, url: str, data_dir: Path, quick: bool) -> dict:
    env = {"OLU_DATA_DIR": str(data_dir), "OLU_DATABASE_URL": url, "OLU_ADMIN_TOKEN": ADMIN,
           "OLU_SQLITE_SYNCHRONOUS": "FULL", "OLU_LOG_LEVEL": "WARNING",
           **NO_RATE_LIMITS}
    api = Server("app.main:app", env)
    stream_name = f"BENCH_{secrets.token_hex(4).upper()}"
    consumer = None
    try:
        with httpx.Client(base_url=api.url, timeout=120) as c:
            r = c.post("/v1/tenants", json={"name": "bench"}, headers={"authorization": f"Bearer {ADMIN}"})
            r.raise_for_status()
            tenant, key = r.json()["id"], r.json()["api_key"]
            c.headers["authorization"] = f"Bearer {key}"
            mids = {p: _new_model(c) for p in ("broker", "http1", "http100")}
            asyncio.run(_streams("create", stream_name, tenant))
            consumer = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "consume", "--stream", stream_name, "--nats-url", NATS,
                 "--batch", "200"], cwd=ROOT, env={**os.environ, **env, "OLU_STREAM_API_KEY": key},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            n = 300 if quick else 2000
            rounds = 2 if quick else 3
            X, y = make_stream(n * (rounds + 1), D, seed=7)
            asyncio.run(_broker_round(tenant, mids["broker"], stream_name, X[:20], y[:20], 10**7))  # warm-up
            _http_round(c, mids["http1"], X[:20], y[:20], 10**7, 1)
            times: dict[str, list[float]] = {"broker": [], "http1": [], "http100": []}
            for k in range(rounds):
                part = slice(k * n, (k + 1) * n)
                times["broker"].append(asyncio.run(_broker_round(tenant, mids["broker"], stream_name, X[part],
                                                                 y[part], k * n)))
                times["http1"].append(_http_round(c, mids["http1"], X[part], y[part], k * n, 1))
                times["http100"].append(_http_round(c, mids["http100"], X[part], y[part], k * n, 100))
            for p, mid in mids.items():  # every example was learned
                step = c.get(f"/v1/models/{mid}").json()["step"]
                assert step == n * rounds + (20 if p != "http100" else 0), (p, step)
        med = {p: statistics.median(v) for p, v in times.items()}
        return {"backend": name, "events": n, "rounds": rounds,
                "rate": {p: n / t for p, t in med.items()},
                "broker_vs_http1": med["http1"] / med["broker"], "broker_vs_http100": med["http100"] / med["broker"]}
    finally:
        if consumer is not None:
            consumer.send_signal(signal.SIGTERM)
            try:
                consumer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                consumer.kill()
        api.stop()
        asyncio.run(_streams("delete", stream_name))


def run(quick: bool, backends: tuple[str, ...]) -> dict:
    if not _nats_up():
        return {"skipped": "no NATS with JetStream at 127.0.0.1:4222 (or nats-py missing)"}
    out: dict = {"results": []}
    for name in backends:
        tmp = Path(tempfile.mkdtemp(prefix="olu-bench-stream-"))
        drop = None
        try:
            if name == "sqlite":
                url = f"sqlite:///{tmp / 'olu.db'}"
            else:
                url, drop = _pg_database()
                if url is None:
                    out["results"].append({"backend": name, "skipped": drop})
                    drop = None
                    continue
            out["results"].append(_backend(name, url, tmp, quick))
        finally:
            if drop is not None:
                drop()
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def table(r: dict) -> list[str]:
    lines = ["## Stream: learn events through NATS JetStream vs HTTP ingest (examples/s, median over rounds)"]
    if "skipped" in r:
        return lines + [f"  skipped: {r['skipped']}"]
    lines.append(f"  {'database':<11}{'events':>7}{'broker 1/event':>16}{'HTTP 1/request':>16}"
                 f"{'HTTP 100/request':>18}{'broker/HTTP-1':>15}{'broker/HTTP-100':>17}")
    for x in r["results"]:
        if "skipped" in x:
            lines.append(f"  {x['backend']:<11}skipped: {x['skipped']}")
            continue
        rt = x["rate"]
        lines.append(f"  {x['backend']:<11}{x['events']:>7}{rt['broker']:>16.0f}{rt['http1']:>16.0f}"
                     f"{rt['http100']:>18.0f}{x['broker_vs_http1']:>14.2f}x{x['broker_vs_http100']:>16.2f}x")
    return lines
