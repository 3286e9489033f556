"""Section 3: the cost of forgetting one record vs retraining from scratch, as the stream grows.

Engine level, d = 16, logistic, every family of ``app.unlearning.ALGORITHMS`` with its default hyperparameters
(rewind_to_delete: initial_size = n so that it trains on the whole stream).  For each stream length n:
``forget`` is the median time of ``engine.forget([u])`` over a few records (the data-holding families get the
retained examples, as the service gives them); ``retrain`` is the time of a fresh engine of the same family
learning the retained stream (n - 1 examples).  Sizes whose projected learning time exceeds the per-family cap
are skipped and listed (``capped``).
"""
from __future__ import annotations

import time

import numpy as np

from app.unlearning import ALGORITHMS, ArrayRetained, CapacityExhausted, SeededNoise, fast

from .common import median_time, spec, stream

D = 16


def _hp(algorithm: str, n: int) -> dict:
    if algorithm == "rewind_to_delete":
        return {"initial_size": max(2, n)}
    if algorithm == "passive_olu_restart":
        return {"max_deletions": 10, "horizon": max(2, n)}
    return {}


def _learn(algorithm: str, n: int, X: np.ndarray, y: np.ndarray):
    cls = ALGORITHMS[algorithm]
    d = X.shape[1]
    e = cls(spec(algorithm, d, _hp(algorithm, n)), SeededNoise(1))
    retained = ArrayRetained(np.zeros(0, dtype=np.int64), np.zeros((0, d)), np.zeros(0)) \
        if cls.needs_retained_data else None
    chunk = n if algorithm == "rewind_to_delete" else 10_000
    steps = []
    for i in range(0, n, chunk):
        steps.append(e.learn(X[i:i + chunk], y[i:i + chunk], retained))
        if cls.needs_retained_data and i + chunk < n:
            s = np.concatenate(steps)
            retained = ArrayRetained(s, X[:len(s)], y[:len(s)])
    return e, np.concatenate(steps)


def run(quick: bool) -> dict:
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000)
    cap_s = 8.0 if quick else 90.0  # per (family, size) projected learning time
    n_forgets = 3 if quick else 5
    out: dict = {"d": D, "sizes": list(sizes), "cap_seconds": cap_s, "families": {}}
    X_all, y_all = stream(max(sizes), D, seed=5)
    for algorithm, cls in ALGORITHMS.items():
        rows, capped = [], []
        last_rate = None
        for n in sizes:
            if last_rate is not None and n / last_rate > cap_s:
                capped.append(n)
                continue
            X, y = X_all[:n], y_all[:n]
            t0 = time.perf_counter()
            e, steps = _learn(algorithm, n, X, y)
            t_learn = time.perf_counter() - t0
            last_rate = n / t_learn
            held = np.ones(n, dtype=bool)
            times, mech = [], None
            rng = np.random.default_rng(n)
            for u in rng.choice(np.arange(n // 2, n), size=n_forgets, replace=False):
                retained = ArrayRetained(steps[held], X[held], y[held]) if cls.needs_retained_data else None
                t0 = time.perf_counter()
                try:
                    certs = e.forget([int(steps[u])], retained)
                except CapacityExhausted:
                    break
                times.append(time.perf_counter() - t0)
                mech = certs[0].mechanism
                held[u] = False
            reps = 3 if t_learn < 0.5 else 1  # short retrains are repeated (median)
            t_retrain = median_time(lambda: _learn(algorithm, int(held.sum()), X[held], y[held]), reps)
            t_forget = float(np.median(times)) if times else None
            rows.append({"n": n, "learn_s": t_learn, "forget_s": t_forget, "retrain_s": t_retrain,
                         "mechanism": mech, "ratio": t_retrain / t_forget if t_forget else None})
        out["families"][algorithm] = {"rows": rows, "capped": capped}
    # the same retrain on the numpy loop (what retraining costs without the compiled path)
    n = 100_000 if 100_000 in sizes else sizes[-1]
    previous = fast.set_enabled(False)
    try:
        t = median_time(lambda: _learn("passive_olu", n - 1, X_all[:n - 1], y_all[:n - 1]), 1)
    finally:
        fast.set_enabled(previous)
    out["numpy_retrain"] = {"n": n, "seconds": t}
    return out
