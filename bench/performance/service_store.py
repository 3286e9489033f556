"""Retained data at scale through HTTP (issue 36 item 2): ``python -m bench.performance.service_store [--n N]``.

A service process (``python -m uvicorn app.main:app``, SQLite, the default settings but for the admin token), one
tenant per model, d = 32, logistic: ``sisa`` and ``retrain`` with ``max_records`` = n, and ``passive_olu``.  Each
learns the same n records in msgpack batches of 10^4 (raw float64 bytes), the three models in turn batch by batch
(a change of load on the shared machine hits all three alike): the ingest rate of each is n / the sum of its
request times.  Then ``FORGETS`` forgets of single records drawn uniformly, one request at a time, the three in
turn: the p50 of each.

Beside them, in this process, the engine of the same spec (read back from the service: its filled-in
hyperparameters) learns the same records (in memory) and forgets the same records (``ArrayRetained``): its p50.
Targets (issue 36 item 2): a forget through HTTP <= 2 x (the engine's forget of the same model + the HTTP forget
floor, passive_olu's forget through HTTP), for sisa and retrain; sisa's ingest >= 0.5 x passive_olu's.

Reused by the ``service_scale`` section (issue 36 item 6): ``start_service``, ``create``, ``learn_all``,
``forget_times`` and ``engine_run`` take any model and database.
"""
from __future__ import annotations

import argparse
import json
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from app.unlearning import ArrayRetained, ModelSpec, engine_class
from app.privacy import rho_from_epsilon_delta

from ..common import machine, stream
from .ingest import Server

D = 32
BATCH = 10_000
FORGETS = 9
TARGET_FORGET = 2.0
TARGET_INGEST = 0.5
WARM = 64  # records a throwaway engine learns and forgets one of before the timed engine starts


def body(algorithm: str, n: int | None, d: int = D) -> dict:
    hp = {} if n is None else {"max_records": n}
    return {"name": f"{algorithm}-{n}", "algorithm": algorithm, "loss": "logistic", "dim": d,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.01,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": hp}


def start_service(data_dir: str, env: dict | None = None) -> tuple[Server, str]:
    """A service process on SQLite in ``data_dir`` with the default settings (and ``env``); (server, admin token)."""
    admin = "bench-" + secrets.token_hex(16)
    srv = Server("app.main:app", {"OLU_DATA_DIR": data_dir, "OLU_ADMIN_TOKEN": admin, "OLU_LOG_LEVEL": "WARNING",
                                  **(env or {})})
    return srv, admin


def tenant_client(url: str, admin: str) -> httpx.Client:
    r = httpx.post(url + "/v1/tenants", json={"name": "bench"}, headers={"authorization": f"Bearer {admin}"})
    r.raise_for_status()
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {r.json()['api_key']}"}, timeout=600)


def create(c: httpx.Client, spec_body: dict) -> dict:
    r = c.post("/v1/models", json=spec_body)
    if r.status_code != 201:
        raise RuntimeError(f"create {spec_body['algorithm']}: {r.status_code} {r.text[:400]}")
    return r.json()


def msgpack_body(ids: list[str], X: np.ndarray, y: np.ndarray) -> bytes:
    import msgpack

    return msgpack.packb({"ids": ids, "x": np.ascontiguousarray(X, "<f8").tobytes(),
                          "y": np.ascontiguousarray(y, "<f8").tobytes()})


def learn_all(targets: list[tuple[httpx.Client, str]], X: np.ndarray, y: np.ndarray, batch: int = BATCH,
              log=print, cap_s: float | None = None) -> tuple[list[float], int]:
    """Learn X, y into every (client, model id) in batches, the targets in turn batch by batch (bodies encoded before
    the clock starts); with ``cap_s``, stops after the round that passes that many seconds of wall time.  (Per
    target the summed request time, the records learned.)"""
    spent, t_start, learned = [0.0] * len(targets), time.perf_counter(), 0
    for k, a in enumerate(range(0, len(X), batch)):
        raw = msgpack_body([f"r{i}" for i in range(a, min(len(X), a + batch))], X[a:a + batch], y[a:a + batch])
        for j, (c, mid) in enumerate(targets):
            t0 = time.perf_counter()
            r = c.post(f"/v1/models/{mid}/learn", content=raw, headers={"content-type": "application/msgpack"})
            spent[j] += time.perf_counter() - t0
            if r.status_code != 200:
                raise RuntimeError(f"learn {mid}: {r.status_code} {r.text[:400]}")
        learned = min(len(X), a + batch)
        if k % 20 == 19:
            log(f" learned {learned:,}: " + ", ".join(f"{learned / s:,.0f}/s" for s in spent))
        if cap_s is not None and time.perf_counter() - t_start > cap_s and learned < len(X):
            log(f" stopped by the {cap_s:.0f} s cap at {learned:,} of {len(X):,} records")
            break
    return spent, learned


def forget_times(targets: list[tuple[httpx.Client, str]], picks: list[int]) -> list[list[float]]:
    """One forget request per pick (record index) and target, the targets in turn; the request times."""
    out: list[list[float]] = [[] for _ in targets]
    for i in picks:
        for j, (c, mid) in enumerate(targets):
            t0 = time.perf_counter()
            r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"r{i}"]})
            out[j].append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"unlearn {mid}: {r.status_code} {r.text[:400]}")
    return out


def engine_spec(view: dict) -> ModelSpec:
    """The engine spec of a model as the service shows it (GET /v1/models/{id}: every filled-in hyperparameter)."""
    return ModelSpec(algorithm=view["algorithm"], loss=view["loss"], dim=view["dim"],
                     x_norm=view["bounds"]["x_norm"], y_abs=view["bounds"]["y_abs"],
                     domain_radius=view["domain_radius"], l2=view["l2"], epsilon=view["privacy"]["epsilon"],
                     delta=view["privacy"]["delta"],
                     rho=rho_from_epsilon_delta(view["privacy"]["epsilon"], view["privacy"]["delta"]),
                     hyperparameters=dict(view["hyperparameters"]), n_classes=view.get("n_classes") or 0)


class _Held(ArrayRetained):
    """``ArrayRetained`` over arrays already in step order, without its sorting copy (which, made per learn request,
    cost O(n^2) at 10^7 records)."""

    def __init__(self, steps: np.ndarray, X: np.ndarray, y: np.ndarray):  # not super().__init__: it would copy
        self.steps, self.X, self.y = steps, X, y


def engine_run(view: dict, X: np.ndarray, y: np.ndarray, picks: list[int], batch: int) -> dict:
    """The engine of the model's spec learns X, y in requests of ``batch`` (timed) and forgets the picks one by one,
    handed the records still held (or, for a family handed the forgotten features, that record); copies not timed."""
    spec = engine_spec(view)
    steps = np.arange(1, len(X) + 1, dtype=np.int64)
    warm = engine_class(spec.algorithm)(spec)  # a throwaway engine first: compiled kernels loaded before the clock
    warm.learn(X[:WARM], y[:WARM], ArrayRetained(steps[:0], X[:0], y[:0]) if warm.needs_retained_data else None)
    warm.forget([1], ArrayRetained(steps[:WARM], X[:WARM], y[:WARM]))
    engine = engine_class(spec.algorithm)(spec)
    keeps = engine.needs_retained_data
    resend = getattr(engine, "needs_deletion_features", False)
    learn_s = 0.0
    for a in range(0, len(X), batch):
        held = _Held(steps[:a], X[:a], y[:a]) if keeps else None
        t0 = time.perf_counter()
        engine.learn(X[a:a + batch], y[a:a + batch], held)
        learn_s += time.perf_counter() - t0
    alive = np.ones(len(X), dtype=bool)
    forget = []
    for i in picks:
        store = None
        if keeps:
            idx = np.flatnonzero(alive)
            store = _Held(steps[idx], X[idx], y[idx])
        elif resend:
            store = ArrayRetained(steps[i:i + 1], X[i:i + 1], y[i:i + 1])
        t0 = time.perf_counter()
        engine.forget([i + 1], store)
        forget.append(time.perf_counter() - t0)
        alive[i] = False
    return {"ingest_per_s": len(X) / learn_s, "forget_s": forget}


def run(n: int, forgets: int = FORGETS, log=print) -> dict:
    X, y = stream(n, D, seed=36)
    picks = [int(i) for i in np.random.default_rng(36).choice(n, size=forgets, replace=False)]
    with tempfile.TemporaryDirectory() as tmp:
        srv, admin = start_service(tmp)
        try:
            names = ("sisa", "retrain", "passive_olu")
            clients = [tenant_client(srv.url, admin) for _ in names]
            views = [create(c, body(a, None if a == "passive_olu" else n)) for c, a in zip(clients, names)]
            targets = [(c, v["id"]) for c, v in zip(clients, views)]
            log("created: " + "; ".join(f"{v['algorithm']} {v['hyperparameters']}" for v in views))
            spent, _ = learn_all(targets, X, y, log=log)
            http = forget_times(targets, picks)
            db_bytes = sum(f.stat().st_size for f in Path(tmp).glob("olu.db*"))
            for c in clients:
                c.close()
        finally:
            srv.stop()
    engine = {a: engine_run(v, X, y, picks, BATCH)["forget_s"] for a, v in zip(names[:2], views[:2])}
    med = {a: statistics.median(t) for a, t in zip(names, http)}
    out = {"n": n, "d": D, "batch": BATCH, "forgets": forgets, "machine": machine(), "db_bytes": db_bytes,
           "hyperparameters": {v["algorithm"]: v["hyperparameters"] for v in views},
           "ingest_per_s": {a: n / s for a, s in zip(names, spent)},
           "http_forget_p50_s": med, "http_forget_s": {a: t for a, t in zip(names, http)},
           "engine_forget_p50_s": {a: statistics.median(t) for a, t in engine.items()},
           "engine_forget_s": engine}
    floor = med["passive_olu"]
    out["ratios"] = {f"{a}_forget_vs_engine_plus_floor": med[a] / (out["engine_forget_p50_s"][a] + floor)
                     for a in engine}
    out["ratios"]["sisa_ingest_vs_passive"] = out["ingest_per_s"]["sisa"] / out["ingest_per_s"]["passive_olu"]
    return out


def report(r: dict) -> str:
    lines = [f"retained data at scale through HTTP: n = {r['n']:,}, d = {r['d']}, SQLite, default settings "
             f"({r['machine']['date_utc']} UTC, {r['machine']['nproc']} cores, load {r['machine']['load_avg']})",
             "| model | ingest (records/s) | forget p50 HTTP | forget p50 engine | HTTP / (engine + floor) |",
             "|---|---|---|---|---|"]
    floor = r["http_forget_p50_s"]["passive_olu"]
    for a in ("sisa", "retrain", "passive_olu"):
        eng = r["engine_forget_p50_s"].get(a)
        ratio = r["ratios"].get(f"{a}_forget_vs_engine_plus_floor")
        lines.append(f"| {a} | {r['ingest_per_s'][a]:,.0f} | {r['http_forget_p50_s'][a] * 1e3:.1f} ms | "
                     + ("-" if eng is None else f"{eng * 1e3:.1f} ms") + " | "
                     + ("(the floor)" if ratio is None else f"{ratio:.2f} (target <= {TARGET_FORGET})") + " |")
    lines.append(f"sisa ingest / passive_olu ingest: {r['ratios']['sisa_ingest_vs_passive']:.2f} (target >= "
                 f"{TARGET_INGEST}); HTTP forget floor (passive_olu) {floor * 1e3:.1f} ms; database "
                 f"{r['db_bytes'] / 1e6:,.0f} MB")
    return "\n".join(lines)


def main() -> None:  # pragma: no cover - a measurement
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--forgets", type=int, default=FORGETS)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    r = run(args.n, args.forgets)
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str))


if __name__ == "__main__":  # pragma: no cover
    main()
