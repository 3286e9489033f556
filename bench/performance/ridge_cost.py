"""Section ``ridge_cost`` (issues 36 item 5, 37 item 7, 38, 39): exact_ridge's learn, forget and solve, before and
after the two-word sums and the one-thread solve, in one run.  ``python -m bench --sections ridge_cost``
(``--quick``: p = 65 and 513 only).

"before" is the engine as it was (kept here as the reference): int64 sums with one word, each chunk's product
formed in blocks of max(32, 2^18 / p^2) rows into a separate array then added, and LU (numpy.linalg.solve) with
OpenBLAS's own thread count.  "after" is today's engine: one product per chunk at p >= 91, integer outer products
for one or two rows, straight into the words; "after, two words" forces the carry of the second word on every
chunk (what a model past 2^61 per entry pays); the solve is Cholesky with BLAS pinned to one thread, and "solve,
unpinned" is the same Cholesky with the library's threads (the pin's cost).  GCV's solve (an eigendecomposition
and the grid) and a private release (the node's discrete Gaussian draws, the eigendecomposition with its shift)
are timed at the same p.  Median of 51 (9 above p = 128, 3 above p = 1 000) per cell; K = 10 classes; records on the unit sphere.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from app.unlearning import ModelSpec, SeededNoise
from app.unlearning.families.exact_ridge import ExactRidge
from app.unlearning.families.ridge_solve import gcv_solve
from app.unlearning.families.ridge_sums import accumulate

DIMS, QUICK_DIMS = (64, 512, 1024, 2048), (64, 512)
CLASSES = 10


def _median(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return float(np.median(out))


def _old_sums(e: ExactRidge, X: np.ndarray, y: np.ndarray):
    """The engine's products before issue 36 (module docstring): blocks of max(32, 2^18 / p^2) rows."""
    p, k = e.spec.dim + 1, e.grid.outputs
    A = np.zeros((p, p), dtype=np.int64)
    B = np.zeros((k, p), dtype=np.int64)
    ra, rb = (max(1, min(e.grid.chunk, max(32, 2**18 // (p * c)))) for c in (p, k))
    for a in range(0, len(y), e.grid.chunk):
        Xq, Tq = e.grid.features(X[a:a + e.grid.chunk]), e.grid.targets(y[a:a + e.grid.chunk])
        FA, FB = Xq[:ra].T @ Xq[:ra], Tq[:rb].T @ Xq[:rb]
        for b in range(ra, len(Xq), ra):
            FA += Xq[b:b + ra].T @ Xq[b:b + ra]
        for b in range(rb, len(Xq), rb):
            FB += Tq[b:b + rb].T @ Xq[b:b + rb]
        A += FA.astype(np.int64)
        B += FB.astype(np.int64)
    return A, B


def measure(d: int) -> dict[str, Any]:
    s = ModelSpec("exact_ridge", "squared", d, 1.0, 1.0, 10.0, 1.0, 1.0, 1e-6, 0.0244, {}, n_classes=CLASSES)
    s = s.with_hyperparameters(ExactRidge.normalize_hyperparameters(s))
    rng = np.random.default_rng(d)
    X = rng.normal(size=(1100, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = rng.integers(0, CLASSES, 1100).astype(float)
    e = ExactRidge(s)
    e.learn(X[:1000], y[:1000])
    reps = 3 if d >= 1000 else 9 if d >= 128 else 51
    out: dict[str, Any] = {"d": d, "p": d + 1}

    def old(rows):
        def f():
            A, B = _old_sums(e, X[rows], y[rows])
            e.sums[0].lo -= A  # what the old forget did: subtract the batch's sums (then add them back)
            e.sums[0].lo += A
        return f

    def new(rows, wide: bool):
        def f():
            accumulate(e.grid, X[rows], y[rows], e.sums, -1, wide)
            accumulate(e.grid, X[rows], y[rows], e.sums, 1, wide)
        return f

    for name, rows in (("learn 1000", slice(0, 1000)), ("forget 1", slice(5, 6)), ("forget 100", slice(5, 105))):
        before = _median(old(rows), reps)
        after = _median(new(rows, False), reps) / 2  # a subtraction and an addition per call
        wide = _median(new(rows, True), reps) / 2
        out[name] = {"before": before, "after": after, "after_two_words": wide}
    def old_solve():  # the weights before: the scaled sums from one word each, then LU with the library's threads
        M = np.ldexp(e.sums[0].lo.astype(np.float64), e._exponents[0].exponents)
        R = np.ldexp(e.sums[1].lo.astype(np.float64), e._exponents[1].exponents)
        M.flat[:: M.shape[0] + 1] += s.l2
        return np.linalg.solve(M, R.T)

    e.weights()
    out["solve"] = {"before": _median(old_solve, reps), "after": _median(lambda: e.weights(), reps)}
    M, R = e._scaled(e.sums[0], e.sums[1])
    M.flat[:: M.shape[0] + 1] += s.l2
    import scipy.linalg as sl
    out["solve"]["after_unpinned"] = _median(lambda: sl.cho_solve(sl.cho_factor(M, lower=True), R.T), reps)
    M0, _ = e._scaled(e.sums[0], e.sums[1])
    out["gcv_solve"] = _median(lambda: gcv_solve(M0, R, 1000.0 * CLASSES, 1000.0, s.l2), max(1, reps - 2))
    if d <= 512:  # a private release: the node's draws and the shifted eigendecomposition
        ps = s.with_hyperparameters({**s.hyperparameters, "publication": "private", "release_horizon": 1000,
                                     "grid_bits": 10})
        ep = ExactRidge(ps.with_hyperparameters(ExactRidge.normalize_hyperparameters(ps)), SeededNoise(0))
        ep.learn(X[:1000], y[:1000])
        out["private_release"] = _median(lambda: (ep.private.step(ep.noise), ep.weights()), max(1, reps - 2))
    return out


def run(quick: bool) -> dict[str, Any]:
    from app.unlearning.mechanism import fast_dgauss
    fast_dgauss.warm_up()
    return {"rows": [measure(d) for d in (QUICK_DIMS if quick else DIMS)]}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.2f}"


def table(r: dict[str, Any]) -> list[str]:
    lines = ["## exact_ridge cost, before vs after (ms, median; K = 10 classes)",
             f"{'p':>5} {'op':<11}{'before':>9}{'after':>9}{'two words':>10}{'after/before':>13}"]
    for row in r["rows"]:
        for op in ("learn 1000", "forget 1", "forget 100"):
            c = row[op]
            lines.append(f"{row['p']:>5} {op:<11}{_ms(c['before']):>9}{_ms(c['after']):>9}"
                         f"{_ms(c['after_two_words']):>10}{c['after'] / c['before']:>13.2f}")
        c = row["solve"]
        lines.append(f"{row['p']:>5} {'solve':<11}{_ms(c['before']):>9}{_ms(c['after']):>9}{'':>10}"
                     f"{c['after'] / c['before']:>13.2f}   (Cholesky unpinned {_ms(c['after_unpinned'])}, GCV "
                     f"{_ms(row['gcv_solve'])}, private release {_ms(row.get('private_release'))})")
    return lines
