"""Latency on a fresh server, nothing else running: ``python -m bench.performance.latency_probe [n]``.

One uvicorn ``app.main:app`` on SQLite (synchronous=FULL), one model (passive OLU, d = 64) with 1000 records, then
n sequential requests each of unlearn(1), predict(1 row), GET /healthz (the HTTP floor of the machine) and learn(1); p50.
"""
from __future__ import annotations

import secrets
import statistics
import sys
import tempfile
import time

import httpx
import orjson

from ..common import stream
from .ingest import Server, _bodies, _new_model


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    tmp, admin = tempfile.mkdtemp(), "a" + secrets.token_hex(16)
    srv = Server("app.main:app", {"OLU_DATA_DIR": tmp, "OLU_ADMIN_TOKEN": admin, "OLU_SQLITE_SYNCHRONOUS": "FULL",
                                  "OLU_LOG_LEVEL": "WARNING"})
    try:
        key = httpx.post(srv.url + "/v1/tenants", json={"name": "probe"},
                         headers={"authorization": f"Bearer {admin}"}).json()["api_key"]
        with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
            mid = _new_model(c)
            X, y = stream(max(1000, n), 64)
            raw, ct = _bodies("columnar", X[:1000], y[:1000], "held")
            c.post(f"/v1/models/{mid}/learn", content=raw, headers={"content-type": ct}).raise_for_status()
            ops = {
                "unlearn(1)": lambda i: c.post(f"/v1/models/{mid}/unlearn", content=orjson.dumps({"ids": [f"held-{i}"]}),
                                               headers={"content-type": "application/json"}),
                "predict": lambda i: c.post(f"/v1/models/{mid}/predict", content=orjson.dumps({"x": [X[i].tolist()]}),
                                            headers={"content-type": "application/json"}),
                "GET /healthz": lambda i: c.get("/healthz"),
                "learn(1)": lambda i: c.post(f"/v1/models/{mid}/learn", content=orjson.dumps(
                    {"examples": [{"id": f"one-{i}", "x": X[i].tolist(), "y": float(y[i])}]}),
                    headers={"content-type": "application/json"}),
            }
            for name, op in ops.items():
                times = []
                for i in range(min(n, 1000)):
                    t0 = time.perf_counter()
                    r = op(i)
                    times.append(time.perf_counter() - t0)
                    r.raise_for_status()
                print(f"{name:>13}: p50 {statistics.median(times[10:]) * 1e3:.2f} ms")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
