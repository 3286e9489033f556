"""exact_ridge's penalty chosen by generalised cross-validation from the integer state alone (issue 39 item 3), and
multi-class as multi-output least squares with one solve (item 4).

GCV(lam) = (RSS(lam) / (n K)) / (1 - df(lam) / n)^2 over the public grid l2 10^(j/4), j = 0..32
(app/unlearning/families/ridge_solve.py).  The engine computes it from the sums A, B and C = sum q(t)^2; the
reference here from the quantised records themselves (the hat matrix written out).  Being a function of the state,
the choice and the weights stay bit-identical after forgets.
"""
from __future__ import annotations

import numpy as np
import pytest

from app.db.state_codec import pack_state, unpack_state
from app.unlearning import ArrayRetained, ModelSpec
from app.unlearning.families.exact_ridge import ExactRidge
from app.unlearning.families.ridge_solve import gcv_grid


def spec(dim=4, n_classes=0, l2=1e-3, **hp) -> ModelSpec:
    s = ModelSpec("exact_ridge", "squared", dim, 1.0, 1.0, 10.0, l2, 1.0, 1e-6, 0.0244, hp, n_classes=n_classes)
    return s.with_hyperparameters(ExactRidge.normalize_hyperparameters(s))


def data(seed, n, dim, n_classes=0, noise=0.5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    X *= 0.95 / np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    w = rng.normal(size=dim)
    if n_classes:
        y = np.argmax(X @ rng.normal(size=(dim, n_classes)) + noise * rng.normal(size=(n, n_classes)), axis=1)
        return X, y.astype(float)
    return X, np.clip(0.3 * X @ w + noise * rng.normal(size=n), -1, 1)


def reference_penalty(e: ExactRidge, X: np.ndarray, y: np.ndarray) -> float:
    """GCV's argmin over the grid, from the quantised records (real units) and the explicit hat matrix."""
    Z = e.grid.features(X) * np.ldexp(1.0, -e.grid.exponents(e.spec.dim))
    T = e.grid.targets(y) * np.ldexp(1.0, -e.grid.ky)
    n, k = T.shape
    best, arg = np.inf, None
    for lam in gcv_grid(e.spec.l2):
        H = Z @ np.linalg.solve(Z.T @ Z + lam * np.eye(Z.shape[1]), Z.T)
        rss = float(np.sum((T - H @ T) ** 2))
        score = (rss / (n * k)) / (1.0 - np.trace(H) / n) ** 2
        if score < best * (1 - 1e-9):
            best, arg = score, lam
    return float(arg)


@pytest.mark.parametrize("K", [0, 3])
def test_gcv_chooses_the_penalty_the_hat_matrix_gives(K):
    s = spec(4, K, l2_selection="gcv")
    X, y = data(1, 150, 4, K)
    e = ExactRidge(s)
    e.learn(X, y)
    assert e.penalty() == reference_penalty(e, X, y)
    assert e.penalty() > s.l2  # noisy labels: more than the smallest penalty
    fixed = ExactRidge(spec(4, K))
    fixed.learn(X, y)
    assert not np.array_equal(fixed.published(), e.published())  # negative control: the choice matters


def test_gcv_stays_bit_identical_after_forgets():
    s = spec(3, 0, l2_selection="gcv")
    X, y = data(4, 80, 3)
    e = ExactRidge(s)
    steps = e.learn(X, y)
    gone = [int(steps[i]) for i in (2, 30, 31, 77)]
    e.forget(gone, ArrayRetained(gone, X[[2, 30, 31, 77]], y[[2, 30, 31, 77]]))
    e = ExactRidge.from_state(s, unpack_state(pack_state(e.state())))
    keep = [i for i in range(80) if i not in (2, 30, 31, 77)][::-1]
    ref = ExactRidge(s)
    ref.learn(X[keep[:40]], y[keep[:40]])
    ref.learn(X[keep[40:]], y[keep[40:]])
    for name in ("A", "B", "C"):
        assert np.array_equal(e.state()[name], ref.state()[name])
    assert e.published().tobytes() == ref.published().tobytes() and e.penalty() == reference_penalty(e, X[keep], y[keep])
    with pytest.raises(ValueError):  # a state without C (created without gcv) cannot serve it
        ExactRidge.from_state(s, {k: v for k, v in e.state().items() if k != "C"})


def test_multi_class_is_one_solve_over_k_outputs_and_equals_one_vs_rest():
    """K outputs share the matrix: one factorisation serves all classes, and each row is the one-vs-rest ridge
    solution of its class (+1 / -1 targets) -- the same model under squared loss."""
    s = spec(5, 4, l2=0.3)
    X, y = data(2, 200, 5, 4)
    e = ExactRidge(s)
    e.learn(X, y)
    W = e.published().reshape(4, 6)
    Z = e.grid.features(X) * np.ldexp(1.0, -e.grid.exponents(5))
    for k in range(4):
        t = np.where(y == k, 1.0, -1.0)
        w = np.linalg.solve(Z.T @ Z + 0.3 * np.eye(6), Z.T @ t)
        assert np.allclose(W[k], w, rtol=1e-9, atol=1e-12)
