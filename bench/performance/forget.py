"""Section 3: the cost of forgetting one record vs retraining from scratch, as the stream grows.

Engine level, d = 16, logistic, every family of ``app.unlearning.ALGORITHMS`` with its default hyperparameters
(rewind_to_delete: initial_size = n so that it trains on the whole stream; second_order_olu: its forget is K full
gradient passes plus a Hessian solve, docs/second_order_olu.md §9) and the production noise source
(``SecureGaussianNoise``: a fresh CSPRNG-seeded generator per draw, as the service runs it; up to af7668c the
forgets were timed with the test-only ``SeededNoise``, which leaves that seeding out).  For each stream length n:

* ``forget`` is the median time of ``engine.forget([u])`` over up to 50 records u drawn from the second half of the
  stream (at least 5; fewer only once the forgets have taken 2 s in total).  The data-holding families get the
  retained examples, as the service gives them; building that view is not timed.
* ``retrain`` is the median time of a fresh engine of the same family learning the retained stream (the examples
  left after those forgets, in step order, compiled learn loop when numba is available): 7 repetitions when
  learning the stream took below 0.1 s, 3 below 1 s, else 1.
* Both are timed back to back (warm), as before: on the reference VM any call that follows an idle pause or a long
  computation pays 10-200 us of cold start, whatever it computes, so one cold call measures the machine; a passive
  forget settles after ~10 calls, hence 50 samples rather than 5.
* The retained arrays are materialised before the retrain clock starts, as the forget side's retained view is (a
  retrain can run over slices of the stored stream without a copy); that copy is reported as ``select_s``.  Up to
  af7668c it was inside the retrain timing, where at 10^5 - 10^6 events the fresh n x d array (page faults
  included) was about a third to a half of the "retrain".  The numba kernels are compiled or loaded first.

Sizes whose projected learning time exceeds the per-family cap are skipped and listed (``capped``); the projection
extrapolates the last measured size with the growth exponent of the last two (at least linear), so families whose
learning is superlinear in n are capped before a 15-minute run rather than after.
"""
from __future__ import annotations

import time

import numpy as np

from app.unlearning import ALGORITHMS, ArrayRetained, CapacityExhausted
from app.unlearning.mechanism import fast, fast_dgauss

from ..common import median_time, projected_time, spec, stream

D = 16
MAX_FORGETS, MIN_FORGETS, FORGET_BUDGET_S = 50, 5, 2.0


def _hp(algorithm: str, n: int) -> dict:
    if algorithm == "rewind_to_delete":
        return {"initial_size": max(2, n)}
    if algorithm == "passive_olu_restart":
        return {"max_deletions": 10, "horizon": max(2, n)}
    if algorithm == "online_dp_tree":
        return {"max_deletions": MAX_FORGETS, "horizon": max(2, n)}
    return {}


def _learn(algorithm: str, n: int, X: np.ndarray, y: np.ndarray, noise=None):
    """A fresh engine (production noise unless ``noise`` is given) that learned X, y; returns (engine, steps)."""
    cls = ALGORITHMS[algorithm]
    d = X.shape[1]
    e = cls(spec(algorithm, d, _hp(algorithm, n)), noise)
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


def run(quick: bool, families: list[str] | None = None, sizes: tuple[int, ...] | None = None) -> dict:
    sizes = sizes or ((1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000))
    cap_s = 8.0 if quick else 90.0  # per (family, size) projected learning time
    max_forgets = MIN_FORGETS if quick else MAX_FORGETS
    out: dict = {"d": D, "sizes": list(sizes), "cap_seconds": cap_s, "families": {},
                 "noise": "SecureGaussianNoise", "numba": fast.available()}
    X_all, y_all = stream(max(sizes), D, seed=5)
    _learn("passive_olu", 100, X_all[:100], y_all[:100])  # compile / load the numba kernels before any timing:
    fast_dgauss.warm_up()  # the learn loop's and the discrete Gaussian sampler's (as the service does at start-up)
    for algorithm, cls in ALGORITHMS.items():
        if families is not None and algorithm not in families:
            continue
        rows, capped, history = [], [], []
        for n in sizes:
            if history and projected_time(history, n) > cap_s:
                capped.append(n)
                continue
            X, y = X_all[:n], y_all[:n]
            t0 = time.perf_counter()
            e, steps = _learn(algorithm, n, X, y)
            t_learn = time.perf_counter() - t0
            history.append((n, t_learn))
            held = np.ones(n, dtype=bool)
            times, mechs = [], set()
            rng = np.random.default_rng(n)
            for u in rng.choice(np.arange(n // 2, n), size=max_forgets, replace=False):
                retained = ArrayRetained(steps[held], X[held], y[held]) if cls.needs_retained_data else None
                if getattr(e, "needs_deletion_features", False) and not e.needs_retained_data:  # the client resends
                    retained = ArrayRetained(steps[u:u + 1], X[u:u + 1], y[u:u + 1])
                t0 = time.perf_counter()
                try:
                    certs = e.forget([int(steps[u])], retained)
                except CapacityExhausted:
                    break
                times.append(time.perf_counter() - t0)
                mechs.add(certs[0].mechanism)
                held[u] = False
                if len(times) >= MIN_FORGETS and sum(times) > FORGET_BUDGET_S:
                    break
            t0 = time.perf_counter()
            Xr, yr = X[held], y[held]  # the retained stream, materialised before the retrain clock starts
            t_select = time.perf_counter() - t0
            reps = 7 if t_learn < 0.1 else 3 if t_learn < 1.0 else 1
            t_retrain = median_time(lambda: _learn(algorithm, len(yr), Xr, yr), reps)
            t_forget = float(np.median(times)) if times else None
            rows.append({"n": n, "learn_s": t_learn, "forget_s": t_forget, "retrain_s": t_retrain, "select_s": t_select,
                         "n_forgets": len(times), "retrain_reps": reps, "mechanism": "/".join(sorted(mechs)) or None,
                         "ratio": t_retrain / t_forget if t_forget else None})
        out["families"][algorithm] = {"rows": rows, "capped": capped}
    # the same retrain on the numpy loop (what retraining costs without the compiled path)
    if families is None or "passive_olu" in families:
        n = 100_000 if 100_000 in sizes else sizes[-1]
        previous = fast.set_enabled(False)
        try:
            t = median_time(lambda: _learn("passive_olu", n - 1, X_all[:n - 1], y_all[:n - 1]), 1)
        finally:
            fast.set_enabled(previous)
        out["numpy_retrain"] = {"n": n, "seconds": t}
    return out
