"""exact_ridge's solves: the published weights from the (exact or noisy) sums, deterministic in them, and the choice
of the penalty by generalised cross-validation from the integer state alone.  The family is in exact_ridge.py.

* **Deterministic.**  Every factorisation runs with BLAS pinned to one thread (app/unlearning/maths/blas.py): the
  weights are a function of the sums alone, not of the machine's core count (issue 37: they differed by up to
  8.2e-15 between OPENBLAS_NUM_THREADS 1 and 2 at d = 200).
* **The solve.**  M = D A D + l2 I is symmetric positive definite: Cholesky (LAPACK potrf/potrs, p^3/3 flops, half
  of LU's), and where it fails in floating point (l2 below A's round-off) the eigendecomposition with eigenvalues
  clipped at ``floor`` (l2), whose answer obeys ||W|| <= ||R|| / l2 whatever the conditioning.
* **GCV** (issue 39 item 3; Golub, Heath & Wahba 1979).  With M0 = D A D = V diag(e) V^T, c = V^T R^T and the
  targets' sum of squares yy = sum ||t||^2, the fit at penalty lam has
      RSS(lam) = yy - sum_i c_i^2 (2 / (e_i + lam) - e_i / (e_i + lam)^2)   (summed over the outputs),
      df(lam)  = sum_i e_i / (e_i + lam),   GCV(lam) = (RSS / (n K)) / (1 - df / n)^2,
  all from the integer sums (yy from the sum C, n from A's intercept corner, exactly).  The penalty is the minimiser
  over a public grid (``gcv_grid``: l2 times 10^(j/4), j = 0..32, its finite points), ties to the smaller; the weights are
  V diag(1 / (e + lam*)) c.  It minimises squared error, which is not accuracy: on the synthetic 10^5 stream it
  lost 2.9 points (issue 39).  The intercept is penalised like the weights (module docstring of exact_ridge).
"""
from __future__ import annotations

import math

import numpy as np

from ..maths.blas import one_blas_thread

GCV_STEPS = 32        # grid points above l2, a quarter decade apart: l2 .. l2 10^8
GCV_STEP = 0.25


def gcv_grid(l2: float) -> np.ndarray:
    """The public penalties GCV chooses from (from the spec alone)."""
    return l2 * 10.0 ** (GCV_STEP * np.arange(GCV_STEPS + 1))


def solve_spd(M: np.ndarray, R: np.ndarray, floor: float) -> np.ndarray:
    """W (K x p) with M W^T = R^T for a symmetric M that should be positive definite: Cholesky, else the
    eigendecomposition with eigenvalues clipped at ``floor`` (also where Cholesky gives a non-finite answer)."""
    import scipy.linalg as sl

    with one_blas_thread():
        try:
            factor = sl.cho_factor(M, lower=True, check_finite=False)
            W = sl.cho_solve(factor, R.T, check_finite=False)
            if np.all(np.isfinite(W)):
                return np.ascontiguousarray(W.T)
        except (np.linalg.LinAlgError, sl.LinAlgError, ValueError):
            pass
        return clipped_solve(M, R, floor)


def clipped_solve(M: np.ndarray, R: np.ndarray, floor: float) -> np.ndarray:
    """W = V diag(1 / max(e, floor)) V^T R^T: positive definite by construction, ||W|| <= ||R|| / floor."""
    with one_blas_thread():
        e, V = np.linalg.eigh(M)
        return np.ascontiguousarray((V @ ((V.T @ R.T) / np.maximum(e, floor)[:, None])).T)


def gcv_solve(M0: np.ndarray, R: np.ndarray, yy: float, n: float, l2: float) -> tuple[np.ndarray, float]:
    """(W, lam*): the weights at the penalty of ``gcv_grid(l2)`` that minimises GCV (module docstring).  With no
    record (n = 0) or no degree of freedom left the smallest penalty serves."""
    with np.errstate(over="ignore"):
        lams = gcv_grid(l2)
    lams = lams[np.isfinite(lams)]                  # a penalty near the float range's edge: the finite ones
    with one_blas_thread():
        e, V = np.linalg.eigh(M0)
        c = V.T @ R.T                               # p x K
    e = np.maximum(e, 0.0)                          # A is positive semidefinite: round-off only below 0
    # RSS is homogeneous of degree 2 in (c, sqrt(yy)): scaled by sqrt(yy) its terms stay in the float range (c^2 / yy
    # is at most about n X~^2, which the record cap keeps finite), and the minimiser does not move
    scale = math.sqrt(yy) if 0.0 < yy < math.inf else 1.0
    cs = c / scale
    c2 = np.sum(cs * cs, axis=1)                    # summed over the outputs
    k = R.shape[0]
    best = 0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        inv = 1.0 / (e[None, :] + lams[:, None])    # grid x p
        rss = yy / scale**2 - (c2[None, :] * (2.0 * inv - e[None, :] * inv * inv)).sum(axis=1)
        df = (e[None, :] * inv).sum(axis=1)
    if n > 0:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
            score = (np.maximum(rss, 0.0) / (n * k)) / (1.0 - df / n) ** 2
        score = np.where((df < n) & np.isfinite(score), score, np.inf)
        if np.isfinite(score).any():
            best = int(np.argmin(score))            # the first minimum: ties to the smaller penalty
    lam = float(lams[best])
    with one_blas_thread():
        W = (V @ (c / (e + lam)[:, None])).T
    return np.ascontiguousarray(W), lam
