"""Section ``feature_maps`` (run by ``accuracy`` too): exact_ridge on public feature maps, over HTTP (issue 39 item 6).

Protocol, per data set (bench/accuracy/feature_maps_data.py): one service (``python -m uvicorn app.main:app``,
SQLite, synchronous=FULL, OLU_MAX_REQUEST_WORK raised to ``WORK`` so that 2 048 centres fit: the exact_ridge solve
at p = 2 049 is estimated at ~9e9 work units, over the default 3e9), one tenant, and these models learning the
70 % training split in requests of up to ``BATCH`` (the model's max_learn_batch where lower):

- ``exact_ridge linear``: the standardised columns clipped to [-4, 4] (bounds.x_norm = 4 sqrt(d));
- ``exact_ridge rbf C``: the raw rows with ``feature_map: {"kind": "rbf", "centres": C}`` and the declared scaling;
- references in the same run, retrained with scikit-learn on the records held: LogisticRegression on the
  standardised columns, HistGradientBoostingClassifier on the raw ones.

Held-out accuracy (POST .../evaluate; for the maps also counted from predict's answers) before, after forgetting 1 %
and after 10 % of the training records (a seeded random choice; client resend: each request carries the records'
x and y), beside the references retrained without them.  Costs through HTTP: learn time per record, the p50 of
``SINGLE`` forgets of one record each (the first of the 1 %), the time per record of the batched forgets, the p50 of
1-row predicts; at D = 1 025 (letter, 1 024 centres) beside passive_olu's forget and predict p50 on the same server.
On letter with 2 048 centres, the model after the 10 % is compared with a fresh model that learned only the rest in
reverse order and in requests of another size: published weights bit for bit.
"""
from __future__ import annotations

import json
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ..common import NO_RATE_LIMITS, machine
from ..performance.ingest import Server
from .feature_maps_data import CLIP, DATASETS, MapData

WORK = "3e10"
BATCH = 1000
FORGET_BATCH = 100
SINGLE = 20
PREDICTS = 50
L2 = 1e-3
CENTRES, QUICK_CENTRES = (1024, 2048), (128, 256)
FRACTIONS = (0.01, 0.10)


class Api:
    def __init__(self, url: str, admin: str):
        with httpx.Client(base_url=url, timeout=600) as c:
            key = c.post("/v1/tenants", json={"name": "maps"}, headers={"authorization": f"Bearer {admin}"}).json()
        self.c = httpx.Client(base_url=url, timeout=600, headers={"authorization": f"Bearer {key['api_key']}"})

    def call(self, method: str, path: str, body: Any = None) -> dict:
        r = self.c.request(method, path, json=body)
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:500]}")
        return r.json() if r.content else {}


def _rows(X: np.ndarray, idx, y) -> list[dict]:
    return [{"id": f"r{i}", "x": X[i].tolist(), "y": int(y[i])} for i in idx]


class Served:
    """One model of the run: what it is sent (``X``: its rows) and its measurements."""

    def __init__(self, api: Api, name: str, body: dict, X: np.ndarray, data: MapData):
        self.api, self.name, self.X, self.data = api, name, X, data
        self.model = api.call("POST", "/v1/models", {"name": name, **body})
        self.mid = self.model["id"]
        hp = self.model["hyperparameters"]
        self.learn_batch = min(BATCH, int(hp.get("max_learn_batch") or BATCH))
        self.forget_batch = min(FORGET_BATCH, int(hp.get("max_forget_batch") or FORGET_BATCH))
        self.rows = min(BATCH, int((self.model.get("feature_map") or {}).get("max_rows") or BATCH))
        self.out: dict[str, Any] = {"D": self.model.get("feature_map", {}).get("dim", data.dim) + 1}

    def learn(self, order: np.ndarray, batch: int | None = None) -> float:
        batch = batch or self.learn_batch
        t = time.perf_counter()
        for a in range(0, len(order), batch):
            self.api.call("POST", f"/v1/models/{self.mid}/learn",
                          {"examples": _rows(self.X, order[a:a + batch], self.data.y_train)})
        return time.perf_counter() - t

    def accuracy(self, X_test: np.ndarray, with_predict: bool = False) -> tuple[float, float | None]:
        y = self.data.y_test
        correct, n, pred_ok = 0, 0, 0
        for a in range(0, len(y), self.rows):
            part = X_test[a:a + self.rows].tolist()
            ev = self.api.call("POST", f"/v1/models/{self.mid}/evaluate", {"x": part, "y": y[a:a + self.rows].tolist()})
            correct, n = correct + ev["correct"], n + ev["n"]
            if with_predict:
                pred = self.api.call("POST", f"/v1/models/{self.mid}/predict", {"x": part})["predictions"]
                pred_ok += int(np.sum(np.asarray(pred) == y[a:a + self.rows]))
        return correct / n, (pred_ok / n if with_predict else None)

    def forget(self, idx: np.ndarray, single: int = 0) -> tuple[list[float], float]:
        """Forget ``idx`` (client resend): the first ``single`` one per request (their times), the rest in batches;
        (single times, seconds per record of the batched ones)."""
        times = []
        for i in idx[:single]:
            t = time.perf_counter()
            self.api.call("POST", f"/v1/models/{self.mid}/unlearn",
                          {"ids": [f"r{i}"], "examples": _rows(self.X, [i], self.data.y_train)})
            times.append(time.perf_counter() - t)
        rest = idx[single:]
        t = time.perf_counter()
        for a in range(0, len(rest), self.forget_batch):
            part = rest[a:a + self.forget_batch]
            self.api.call("POST", f"/v1/models/{self.mid}/unlearn",
                          {"ids": [f"r{i}" for i in part], "examples": _rows(self.X, part, self.data.y_train)})
        return times, (time.perf_counter() - t) / max(1, len(rest))

    def predict_p50(self, X_test: np.ndarray) -> float:
        times = []
        for i in range(PREDICTS):
            t = time.perf_counter()
            self.api.call("POST", f"/v1/models/{self.mid}/predict", {"x": [X_test[i % len(X_test)].tolist()]})
            times.append(time.perf_counter() - t)
        return statistics.median(times)


def _references(d: MapData, plans: list[np.ndarray]) -> dict[str, dict[str, float]]:
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    out: dict[str, dict[str, float]] = {}
    for name, make, prep in (("logistic retrain", lambda: LogisticRegression(max_iter=3000), d.standardised),
                             ("HistGradientBoosting retrain", lambda: HistGradientBoostingClassifier(random_state=0),
                              lambda X: X)):
        row: dict[str, float] = {}
        for label, gone in zip(("before",) + tuple(f"{round(100 * f)}%" for f in FRACTIONS), plans):
            keep = np.setdiff1d(np.arange(len(d.y_train)), gone)
            t = time.perf_counter()
            with threadpool_limits(1):  # one core, as a request of the service (OpenMP threads on a shared machine
                model = make().fit(prep(d.X_train[keep]), d.y_train[keep])  # oversubscribe: 100x slower)
            row[f"fit_s {label}"] = time.perf_counter() - t
            row[label] = float(np.mean(model.predict(prep(d.X_test)) == d.y_test))
        out[name] = row
    return out


def _one_dataset(api: Api, d: MapData, centres: tuple[int, ...], quick: bool, check_bits: bool) -> dict[str, Any]:
    n = len(d.y_train)
    rng = np.random.default_rng(1)
    order = rng.permutation(n)
    ks = [max(1, round(f * n)) for f in FRACTIONS]
    plans = [np.array([], dtype=np.int64)] + [order[:k] for k in ks]
    common = {"algorithm": "exact_ridge", "loss": "squared", "n_classes": d.classes, "l2": L2, "dim": d.dim}
    models = [("exact_ridge linear", {**common, "bounds": {"x_norm": CLIP * float(np.sqrt(d.dim))}},
               d.standardised(d.X_train), d.standardised(d.X_test))]
    for C in centres:
        fm = {"kind": "rbf", "centres": C, "centre": d.centre, "scale": d.scale}
        models.append((f"exact_ridge rbf {C}", {**common, "bounds": {"x_norm": 1.0}, "feature_map": fm},
                       d.X_train, d.X_test))
    rows: dict[str, Any] = {}
    for name, body, X, X_test in models:
        m = Served(api, name, body, X, d)
        learn_s = m.learn(np.arange(n))
        acc, via_predict = m.accuracy(X_test, with_predict="rbf" in name)
        r = {"D": m.out["D"], "before": acc, "learn_ms_per_record": 1e3 * learn_s / n}
        if via_predict is not None:
            r["before (predict)"] = via_predict
        r["predict_1_p50_ms"] = 1e3 * m.predict_p50(X_test)
        done = 0
        for k, label in zip(ks, (f"{round(100 * f)}%" for f in FRACTIONS)):
            single, per = m.forget(order[done:k], single=SINGLE if done == 0 else 0)
            if single:
                r["forget_1_p50_ms"] = 1e3 * statistics.median(single)
            r[f"forget_ms_per_record {label}"] = 1e3 * per
            done = k
            r[label] = m.accuracy(X_test)[0]
        if check_bits and name == models[-1][0]:
            fresh = Served(api, name + " (fresh)", body, X, d)
            fresh.learn(np.setdiff1d(np.arange(n), order[:ks[-1]])[::-1], batch=max(1, fresh.learn_batch // 2 + 7))
            a = api.call("GET", f"/v1/models/{m.mid}/parameters")["weights"]
            b = api.call("GET", f"/v1/models/{fresh.mid}/parameters")["weights"]
            r["bit_identical_to_fresh"] = a == b
            api.call("DELETE", f"/v1/models/{fresh.mid}")
        api.call("DELETE", f"/v1/models/{m.mid}")
        rows[name] = r
    refs = _references(d, plans)
    return {"what": d.what, "n_train": n, "n_test": len(d.y_test), "dim": d.dim, "classes": d.classes,
            "forgotten": dict(zip((f"{round(100 * f)}%" for f in FRACTIONS), ks)), "models": rows, "references": refs}


def _passive_costs(api: Api, d: MapData) -> dict[str, float]:
    """passive_olu (logistic, d input features on the unit sphere) on the same server: 1-record forget and 1-row
    predict p50, the baseline of the D = 1 025 figures."""
    X = d.standardised(d.X_train)
    X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    binary = MapData(d.name, d.what, d.X_train, (d.y_train == d.y_train[0]).astype(int), d.X_test, d.y_test, 2,
                     d.centre, d.scale)
    m = Served(api, "passive baseline", {"algorithm": "passive_olu", "loss": "logistic", "dim": d.dim,
                                         "bounds": {"x_norm": 1.0}, "l2": 0.01}, X, binary)
    m.learn(np.arange(min(2000, len(binary.y_train))))
    times = []
    for i in range(SINGLE):
        t = time.perf_counter()
        api.call("POST", f"/v1/models/{m.mid}/unlearn", {"ids": [f"r{i}"]})
        times.append(time.perf_counter() - t)
    out = {"forget_1_p50_ms": 1e3 * statistics.median(times), "predict_1_p50_ms": 1e3 * m.predict_p50(X)}
    api.call("DELETE", f"/v1/models/{m.mid}")
    return out


def run(quick: bool = False, only: str | None = None, partial: str | None = None) -> dict[str, Any]:
    """The section; ``only`` (or OLU_BENCH_MAPS): a comma-separated subset of the data sets; ``partial`` (or
    OLU_BENCH_MAPS_PARTIAL): a JSON file rewritten after each data set (a long run keeps what it measured)."""
    only = only or os.environ.get("OLU_BENCH_MAPS")
    partial = partial or os.environ.get("OLU_BENCH_MAPS_PARTIAL")
    wanted = None if not only else {n.strip() for n in only.split(",")}
    tmp = tempfile.mkdtemp(prefix="olu-maps-")
    admin = secrets.token_hex(16)
    env = {"OLU_DATA_DIR": tmp, "OLU_ADMIN_TOKEN": admin, "OLU_SQLITE_SYNCHRONOUS": "FULL",
           "OLU_MAX_REQUEST_WORK": WORK, "OLU_TENANT_MAX_BYTES": "0", "OLU_TENANT_MAX_RECORDS": "0",
           "OLU_REQUEST_DEADLINE_SECONDS": "120", **NO_RATE_LIMITS}
    srv = Server("app.main:app", env)
    out: dict[str, Any] = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
                           "quick": quick, "l2": L2, "work": WORK, "datasets": {}, "skipped": {},
                           "cpus": os.cpu_count()}
    centres = QUICK_CENTRES if quick else CENTRES
    try:
        api = Api(srv.url, admin)
        for name, load in DATASETS:
            if wanted is not None and name not in wanted:
                continue
            d = load(quick)
            if isinstance(d, str):
                out["skipped"][name] = d
                continue
            t = time.perf_counter()
            out["datasets"][d.name] = _one_dataset(api, d, centres, quick, check_bits=name == "letter")
            out["datasets"][d.name]["seconds"] = time.perf_counter() - t
            print(f"feature_maps: {d.name} done in {time.perf_counter() - t:.0f} s", flush=True)
            if name == "letter":
                out["passive_baseline"] = _passive_costs(api, d)
            if partial:
                Path(partial).write_text(json.dumps(out, indent=1, default=str) + "\n")
    finally:
        srv.stop()
    return out
