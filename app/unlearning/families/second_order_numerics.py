"""Second-order OLU's numerics (paper 001 Algorithm 3, digest §2.8; docs/second_order_olu.md): the
Hessian-Lipschitz constant M of each loss, the retained examples of one forget request (materialised once when
small, re-streamed otherwise) and the conjugate-gradient solver of the Newton system.  The engine is in
second_order.py."""
from __future__ import annotations

import math
from typing import Collection, Iterator

import numpy as np

from ..contract.errors import SpecError
from ..contract.unlearner import RetainedData
from ..maths.losses import augment

# Materialise the retained set for a forget only while it stays below this many floats (else re-stream).
CACHE_FLOATS = 16_000_000  # 128 MB: covers d = 1000 up to n = 16 000 (measured in docs)

# sup |sigma''| for the logistic sigmoid: sigma'' = s(1-s)(1-2s), maximal at s = (3 -+ sqrt 3)/6
LOGISTIC_D3 = 1.0 / (6.0 * math.sqrt(3.0))

# sup over unit h of |E_p[(h - E_p h)^3]| <= max|h_k - E_p h| Var_p(h) <= sqrt(2) / 2 (losses.py docstring)
SOFTMAX_D3 = 1.0 / math.sqrt(2.0)


def hessian_lipschitz(loss_name: str, feature_bound: float) -> float:
    """M with ||grad^2 l(w) - grad^2 l(v)|| <= M ||w - v|| for every accepted example (docs/second_order_olu.md §2).

    l(w) = phi(x~.w) gives grad^2 l = phi''(x~.w) x~ x~^T, so M = sup|phi'''| X~^3: squared phi'' = 1 (M = 0);
    logistic phi'' = s(1-s), |phi'''| <= 1/(6 sqrt 3).  Huber's phi'' jumps at |r| = delta: no finite M."""
    if loss_name == "squared":
        return 0.0
    if loss_name == "logistic":
        return LOGISTIC_D3 * feature_bound**3
    if loss_name == "softmax":  # |D^3 lse| <= 1/sqrt(2) as a symmetric trilinear form (losses.py docstring)
        return SOFTMAX_D3 * feature_bound**3
    raise SpecError(f"loss {loss_name!r} has no finite Hessian-Lipschitz constant, which second_order_olu's "
                    "Newton-step certificate needs; use loss 'logistic' or 'squared'", fields=("loss",))


class _Data:
    """The retained examples of one forget request, materialised once when small, re-streamed otherwise."""

    def __init__(self, retained: RetainedData, chunk_size: int):
        self.retained = retained
        self.chunk_size = chunk_size
        cache: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = []
        floats = 0
        for s, X, y in retained.chunks(chunk_size):
            floats += X.size
            cache.append((np.asarray(s, dtype=np.int64), augment(np.asarray(X, dtype=np.float64)),
                          np.asarray(y, dtype=np.float64)))
            if floats > CACHE_FLOATS:
                cache = None
                break
        self.cache = cache

    def batches(self, exclude: Collection[int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(X_aug, y) chunks of the retained examples minus ``exclude``."""
        if self.cache is not None:
            ex = np.fromiter(exclude, dtype=np.int64, count=len(exclude))
            for s, Xa, y in self.cache:
                if len(ex):
                    keep = ~np.isin(s, ex)
                    if not keep.all():
                        Xa, y = Xa[keep], y[keep]
                if len(y):
                    yield Xa, y
        else:
            for _, X, y in self.retained.chunks(self.chunk_size, exclude=exclude):
                yield augment(np.asarray(X, dtype=np.float64)), np.asarray(y, dtype=np.float64)

    def count(self, exclude: Collection[int]) -> int:
        return sum(len(y) for _, y in self.batches(exclude))


def grad_flops_curvature(p: int) -> float:
    """Multiply-adds of one example's curvature weights (hessian_parts: its scores and their second derivative)."""
    return 4.0 * p


def cg(hvp, b: np.ndarray, tol: float, max_iter: int) -> tuple[np.ndarray, float]:
    """Conjugate gradient for H x = b (H symmetric positive definite, given by products): (x, ||b - H x||).
    The recursive residual is re-checked with one explicit product before returning."""
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = float(r @ r)
    for _ in range(max_iter):
        if math.sqrt(rr) <= 0.5 * tol:
            break
        Hp = hvp(p)
        a = rr / float(p @ Hp)
        x += a * p
        r -= a * Hp
        rr_new = float(r @ r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, float(np.linalg.norm(b - hvp(x)))
