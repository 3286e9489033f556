"""The API layer's own cost per request: ``python -m bench.performance.api_overhead [n] [rounds]``.

The app is called in process through ASGI (no sockets, no HTTP parser), with ``ModelService.predict``, ``unlearn``
and ``learn`` replaced by functions returning a recorded answer: what is left is authentication, body parsing,
dependency solving, the worker-thread hop, response validation and serialisation, and the middleware. Prints the
median over rounds of the per-round p50 wall time and of the process CPU time per request (all threads).
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time

import orjson

from ..common import stream


def _app():
    os.environ.update({"OLU_DATA_DIR": tempfile.mkdtemp(), "OLU_LOG_LEVEL": "WARNING", "OLU_RATE_LIMIT": "1e9"})
    from app.main import create_app
    from app.schemas import ModelCreate

    app = create_app()
    ctx = app.state.ctx
    tenant = ctx.tenants.create_tenant("overhead")
    tid = tenant["id"]
    mid = ctx.models.create(tid, ModelCreate(name="m", dim=64, bounds={"x_norm": 1.0}).model_dump(), None)["id"]
    X, y = stream(1000, 64)
    ctx.models.learn(tid, mid, [f"h-{i}" for i in range(1000)], X, y)
    answers = {"unlearn": ctx.models.unlearn(tid, mid, ["h-1"]), "predict": ctx.models.predict(tid, mid, [X[0].tolist()]),
               "learn": ctx.models.learn(tid, mid, ["new-1"], X[:1], y[:1])}
    services = {"unlearn": ctx.models.forgetting, "predict": ctx.models.prediction, "learn": ctx.models.learning}
    for name, answer in answers.items():  # on the use case's service: the routes call it
        setattr(services[name], name, lambda *a, _answer=answer, **k: _answer)
    return app, tenant["api_key"], mid, X


async def _call(app, method: str, path: str, body: bytes = b"", headers=()) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"bench"), (b"content-length", str(len(body)).encode()), *headers],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    status = []

    async def receive():
        if pending:
            return pending.pop()
        await asyncio.sleep(3600)

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    return status[0]


async def _main(n: int, rounds: int) -> None:
    app, key, mid, X = _app()
    auth, ctype = (b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")
    ops = {
        "GET /healthz": lambda i: _call(app, "GET", "/healthz"),
        "predict": lambda i: _call(app, "POST", f"/v1/models/{mid}/predict",
                                   orjson.dumps({"x": [X[i % 1000].tolist()]}), [auth, ctype]),
        "unlearn(1)": lambda i: _call(app, "POST", f"/v1/models/{mid}/unlearn",
                                      orjson.dumps({"ids": [f"h-{i}"]}), [auth, ctype]),
        "learn(1)": lambda i: _call(app, "POST", f"/v1/models/{mid}/learn", orjson.dumps(
            {"examples": [{"id": f"n-{i}", "x": X[i % 1000].tolist(), "y": 1.0}]}), [auth, ctype]),
    }
    wall: dict[str, list[float]] = {k: [] for k in ops}
    cpu: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(rounds):
        for name, op in ops.items():
            times, c0 = [], time.process_time()
            for i in range(n):
                t0 = time.perf_counter()
                status = await op(i)
                times.append(time.perf_counter() - t0)
                assert status == 200, (name, status)
            wall[name].append(statistics.median(times) * 1e6)
            cpu[name].append((time.process_time() - c0) / n * 1e6)
    for name in ops:
        print(f"{name:>13}: p50 {statistics.median(wall[name]):6.0f} us, cpu {statistics.median(cpu[name]):6.0f} us/request")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    try:
        import uvloop  # what uvicorn uses when installed
    except ImportError:
        uvloop = None
    (uvloop.run if uvloop else asyncio.run)(_main(n, rounds))


if __name__ == "__main__":
    main()
