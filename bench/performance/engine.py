"""Section 1: engine learn throughput (events/s), passive OLU logistic vs river and a plain numpy OGD loop.

All learners see the same stream (rows in the unit ball, 0/1 labels) in the same order:
- ``olu_fast_batch``: ``PassiveOLU.learn`` on batches of 1000 (the service path) with the compiled loop;
- ``olu_fast_event``: ``PassiveOLU.learn`` called once per event (1-row arrays), compiled loop;
- ``olu_numpy_batch``: ``PassiveOLU.learn`` on batches with the compiled loop switched off (the numpy fallback);
- ``numpy_loop``: a bare per-step OGD loop in numpy (gradient, step, projection), no service bookkeeping;
- ``river``: ``river.linear_model.LogisticRegression.learn_one`` on dict features (the peer baseline),
  SGD with the same l2.

``exact_ridge_d64``: exact_ridge's learn ingest against passive_olu's at d = 64 (``ridge_vs_passive``).
"""
from __future__ import annotations

import math
import statistics
import time

import numpy as np

from app.unlearning import ALGORITHMS, PassiveOLU
from app.unlearning.mechanism import fast

from ..common import median_time, spec, stream


def numpy_ogd(X: np.ndarray, y: np.ndarray, mu: float, beta: float, R: float) -> np.ndarray:
    theta = np.zeros(X.shape[1] + 1)
    cap, t0 = 2.0 / (beta + mu), math.ceil((beta + mu) / (2 * mu))
    for t, (x, label) in enumerate(zip(X, y), start=1):
        s = x @ theta[:-1] + theta[-1]
        r = 0.5 * (1.0 + math.tanh(0.5 * s)) - label
        g = np.append(r * x, r) + mu * theta
        theta = theta - (cap if t < t0 else 1.0 / (mu * t)) * g
        n = np.linalg.norm(theta)
        if n > R:
            theta *= R / n
    return theta


def run(quick: bool) -> dict:
    dims = (16, 64, 256)
    n = 5_000 if quick else 50_000
    n_slow = 2_000 if quick else 10_000  # per-event Python loops (numpy loop, river, per-event calls)
    repeats = 3 if quick else 5
    rows = []
    try:
        from river import linear_model, optim
    except ImportError:  # pragma: no cover
        linear_model = None
    for d in dims:
        X, y = stream(n, d, seed=d)
        s = spec("passive_olu", d)
        row: dict = {"d": d, "n": n, "n_slow": n_slow}

        def olu_batch():
            e = PassiveOLU(s)
            for i in range(0, n, 1000):
                e.learn(X[i:i + 1000], y[i:i + 1000])

        def olu_event():
            e = PassiveOLU(s)
            for i in range(n_slow):
                e.learn(X[i:i + 1], y[i:i + 1])

        if fast.available():
            PassiveOLU(s).learn(X[:2], y[:2])  # compile outside the timing
            row["olu_fast_batch"] = n / median_time(olu_batch, repeats)
            row["olu_fast_event"] = n_slow / median_time(olu_event, repeats)
        prev = fast.set_enabled(False)
        try:
            row["olu_numpy_batch"] = n_slow / median_time(
                lambda: PassiveOLU(s).learn(X[:n_slow], y[:n_slow]), repeats)
        finally:
            fast.set_enabled(prev)
        e = PassiveOLU(s)
        row["numpy_loop"] = n_slow / median_time(
            lambda: numpy_ogd(X[:n_slow], y[:n_slow], e.mu, e.beta, s.domain_radius), repeats)
        if linear_model is not None:
            feats = [{f"f{j}": float(v) for j, v in enumerate(x)} for x in X[:n_slow]]
            labels = [bool(v) for v in y[:n_slow]]

            def river_run():
                m = linear_model.LogisticRegression(optimizer=optim.SGD(0.1), l2=s.l2)
                for f, lab in zip(feats, labels):
                    m.learn_one(f, lab)

            row["river"] = n_slow / median_time(river_run, repeats)
        best = row.get("olu_fast_batch", row["olu_numpy_batch"])
        row["ratio_vs_river"] = best / row["river"] if row.get("river") else None
        row["ratio_vs_numpy_loop"] = best / row["numpy_loop"]
        row["ratio_event_vs_river"] = (row["olu_fast_event"] / row["river"]
                                       if row.get("river") and "olu_fast_event" in row else None)
        rows.append(row)
    # equality of the two paths on this stream (the test checks <= 1e-12; report the actual gap)
    gap = None
    if fast.available():
        X, y = stream(n_slow, 64, seed=1)
        s = spec("passive_olu", 64)
        a = PassiveOLU(s)
        a.learn(X, y)
        prev = fast.set_enabled(False)
        try:
            b = PassiveOLU(s)
            b.learn(X, y)
        finally:
            fast.set_enabled(prev)
        gap = float(np.max(np.abs(a.theta - b.theta)))
    return {"rows": rows, "fast_available": fast.available(), "max_abs_gap_fast_vs_numpy_d64": gap,
            "river": getattr(__import__("river"), "__version__", None) if linear_model else None,
            "exact_ridge_d64": ridge_vs_passive(n, repeats)}


def ridge_vs_passive(n: int, repeats: int) -> dict:
    """exact_ridge (least squares on +-1 targets, 2 classes) against passive_olu (logistic, compiled loop where
    numba is there) at d = 64: requests of 1000 records, the published weights read after each (as the service
    stores them per version).  The two alternate request by request, each timed alone, so that a load change on
    the machine hits both alike; events/s = n / median over ``repeats`` runs of the summed request times."""
    X, y = stream(n, 64, seed=64)
    names = ("passive_olu", "exact_ridge")
    for algorithm in names:  # warm-up: the compiled kernel, BLAS
        e = ALGORITHMS[algorithm](spec(algorithm, 64))
        e.learn(X[:1000], y[:1000])
        e.published()
    totals: dict = {a: [] for a in names}
    for _ in range(repeats):
        engines = {a: ALGORITHMS[a](spec(a, 64)) for a in names}
        spent = dict.fromkeys(names, 0.0)
        for i in range(0, n, 1000):
            for a, e in engines.items():
                t0 = time.perf_counter()
                e.learn(X[i:i + 1000], y[i:i + 1000])
                e.published()
                spent[a] += time.perf_counter() - t0
        for a in names:
            totals[a].append(spent[a])
    out = {a: n / statistics.median(ts) for a, ts in totals.items()}
    return {"n": n, "batch": 1000, "repeats": repeats, "events_per_s": out,
            "ratio": out["exact_ridge"] / out["passive_olu"]}
