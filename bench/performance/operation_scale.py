"""A retrain of a large model run as an operation (issue 36 item 4), through HTTP:
``python -m bench.performance.operation_scale [--records 1000000] [--dim 32] [--algorithm sisa]``.

One uvicorn ``app.main:app`` on SQLite.  The model is created and filled with ``OLU_MAX_REQUEST_WORK=1e12`` (so that
it is admitted whatever the admission of the day: issue 36 item 3), in msgpack batches of 10^4; the service is then
restarted with the default budget, under which one retrain of the model is over one request's budget: ``POST
/retrain`` must answer 202 with an operation, whose progress is sampled every 0.25 s until it succeeds.  A second
retrain is cancelled once its progress moved (the time until it reports cancelled, and the model's version
unchanged).  Beside it, the engine's own retrain of the same examples in memory (no store, no HTTP).
"""
from __future__ import annotations

import argparse
import secrets
import tempfile
import time

import httpx
import numpy as np

from ..common import spec, stream
from .ingest import Server, _bodies

BATCH = 10_000
ENDED = ("succeeded", "failed", "cancelled")


def _follow(c: httpx.Client, op_id: str, until, every: float = 0.25) -> tuple[dict, list[tuple[float, str, int]]]:
    t0, samples = time.perf_counter(), []
    while True:
        op = c.get(f"/v1/operations/{op_id}").json()
        samples.append((time.perf_counter() - t0, op["status"], op["progress"]["done"]))
        if until(op):
            return op, samples
        time.sleep(every)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--algorithm", default="sisa")
    a = ap.parse_args()
    n, d = a.records, a.dim
    tmp, admin = tempfile.mkdtemp(prefix="olu-opscale-"), "a" + secrets.token_hex(16)
    env = {"OLU_DATA_DIR": tmp, "OLU_ADMIN_TOKEN": admin, "OLU_LOG_LEVEL": "WARNING", "OLU_TENANT_MAX_BYTES": "0",
           "OLU_TENANT_MAX_RECORDS": "0"}
    X, y = stream(n, d, seed=3)
    srv = Server("app.main:app", {**env, "OLU_MAX_REQUEST_WORK": "1e12"})
    try:
        key = httpx.post(srv.url + "/v1/tenants", json={"name": "opscale"},
                         headers={"authorization": f"Bearer {admin}"}).json()["api_key"]
        with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {key}"}, timeout=600) as c:
            body = {"name": "large", "algorithm": a.algorithm, "loss": "logistic", "dim": d, "bounds": {"x_norm": 1.0},
                    "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6},
                    "hyperparameters": {"max_records": n}}
            r = c.post("/v1/models", json=body)
            r.raise_for_status()
            mid = r.json()["id"]
            t0 = time.perf_counter()
            for b in range(0, n, BATCH):
                raw, ct = _bodies("msgpack", X[b:b + BATCH], y[b:b + BATCH], f"b{b}")
                r = c.post(f"/v1/models/{mid}/learn", content=raw, headers={"content-type": ct})
                if r.status_code != 200:
                    raise RuntimeError(f"learn: {r.status_code} {r.text[:300]}")
            ingest = time.perf_counter() - t0
    finally:
        srv.stop()
    srv = Server("app.main:app", env)  # the default budget: one retrain of this model is over it
    try:
        with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {key}"}, timeout=600) as c:
            before = c.get(f"/v1/models/{mid}").json()
            t0 = time.perf_counter()
            r = c.post(f"/v1/models/{mid}/retrain")
            answered = time.perf_counter() - t0
            print(f"POST /retrain (no Prefer): {r.status_code} in {answered * 1e3:.1f} ms, "
                  f"location {r.headers.get('location')}")
            if r.status_code != 202:
                raise SystemExit(f"expected 202: {r.text[:300]}")
            op, samples = _follow(c, r.json()["id"], lambda o: o["status"] in ENDED)
            took = time.perf_counter() - t0
            moving = sorted({done for _, status, done in samples if status == "running"})
            print(f"retrain operation: {op['status']} in {took:.1f} s; progress {op['progress']}; "
                  f"{len(moving)} distinct progress values while running "
                  f"({', '.join(str(v) for v in moving[:6])}{' ...' if len(moving) > 6 else ''}); "
                  f"result {op['result']}")
            after = c.get(f"/v1/models/{mid}").json()
            print(f"model version {before['version']} -> {after['version']}, "
                  f"epoch {before['epoch']} -> {after['epoch']}")
            r = c.post(f"/v1/models/{mid}/retrain")
            second = r.json()["id"]
            _follow(c, second, lambda o: o["progress"]["done"] > 0 or o["status"] in ENDED, 0.05)
            t1 = time.perf_counter()
            c.post(f"/v1/operations/{second}/cancel").raise_for_status()
            op, _ = _follow(c, second, lambda o: o["status"] in ENDED, 0.02)
            stopped = time.perf_counter() - t1
            last = c.get(f"/v1/models/{mid}").json()
            print(f"second retrain cancelled at {op['progress']}: {op['status']} {stopped * 1e3:.0f} ms after the "
                  "cancel; "
                  f"model version {last['version']} (unchanged: {last['version'] == after['version']})")
    finally:
        srv.stop()
    from app.unlearning import ArrayRetained, engine_class

    engine = engine_class(a.algorithm)(spec(a.algorithm, d, {"max_records": n}))
    engine.learn(X, y, ArrayRetained(np.zeros(0, dtype=np.int64), np.zeros((0, d)), np.zeros(0)))
    t0 = time.perf_counter()
    engine.retrain(ArrayRetained(np.arange(1, n + 1), X, y))
    engine_s = time.perf_counter() - t0
    print(f"ingest {n / ingest:,.0f} records/s ({ingest:.1f} s); retrain through the operation {took:.1f} s, "
          f"the engine's in memory {engine_s:.1f} s ({took / engine_s:.1f}x)")


if __name__ == "__main__":
    main()
