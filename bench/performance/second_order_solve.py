"""The Newton system of second_order_olu: direct (form H, LAPACK solve) vs conjugate gradient on Hessian-vector
products, by dimension.  ``python -m bench.performance.second_order_solve [--n N] [--dims 50,200,1000]``.

Engine level, logistic, l2 = 0.05 (``--hard``: 0.001 and a decaying feature spectrum), x_norm = 1, n retained records in one materialised chunk set, the system at the
ERM of the data (what a deletion solves after its GD phase), both to the certified residual tolerance
SOLVE_RTOL * L_B / n'.  Reports the minimum of 5 timings of each solver and the CG iteration count.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from app.unlearning import ArrayRetained, ModelSpec
from app.unlearning.families.second_order import SecondOrderOLU
from app.unlearning.families.second_order_numerics import _Data, cg


def _engine(d: int, solver: str, l2: float) -> SecondOrderOLU:
    s = ModelSpec("second_order_olu", "logistic", d, 1.0, 1.0, 10.0, l2, 1.0, 1e-6, 0.0175, {"solver": solver})
    return SecondOrderOLU(s.with_hyperparameters(SecondOrderOLU.normalize_hyperparameters(s)))


def measure(d: int, n: int, reps: int = 5, hard: bool = False) -> dict:
    """``hard``: l2 = 0.001 and features with a decaying spectrum (scale j^-1/2 on coordinate j), so that H is
    ill-conditioned (kappa up to ~ X^2/(4 l2) = 500) and CG needs many more iterations."""
    rng = np.random.default_rng(d)
    X = rng.standard_normal((n, d))
    if hard:
        X *= np.arange(1, d + 1) ** -0.5
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (X @ rng.standard_normal(d) + 0.3 * rng.standard_normal(n) > 0).astype(float)
    e = _engine(d, "direct", 0.001 if hard else 0.05)
    data = _Data(ArrayRetained(np.arange(1, n + 1), X, y), 4096)
    theta = e.gd(np.zeros(d + 1), data, (), n, 50)
    hvp, dense = e.newton_system(theta, data, (), n - 1)
    b = rng.standard_normal(d + 1) * e.L_B / (n - 1)
    tol = e.solve_tolerance(1, n - 1)
    out = {"d": d, "n": n, "case": "hard" if hard else "isotropic"}
    for name in ("direct", "cg"):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            if name == "direct":
                H = dense()
                x = np.linalg.solve(H, b)
                iters = None
            else:
                x, r = cg(hvp, b, tol, 2 * (d + 1) + 50)
                assert r <= tol
            times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = float(np.min(times))  # min: the machine is shared, the minimum is the least disturbed
        out[f"{name}_x"] = x
    # CG iterations to the tolerance (count the products)
    count = [0]

    def counted(v):
        count[0] += 1
        return hvp(v)

    cg(counted, b, tol, 2 * (d + 1) + 50)
    out["cg_iterations"] = count[0] - 1
    out["agree"] = float(np.linalg.norm(out.pop("direct_x") - out.pop("cg_x")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--dims", default="50,200,1000")
    ap.add_argument("--hard", action="store_true", help="ill-conditioned case (l2 = 0.001, decaying spectrum)")
    a = ap.parse_args()
    rows = [measure(int(d), a.n, hard=a.hard) for d in a.dims.split(",")]
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
