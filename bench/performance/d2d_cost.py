"""Cost per deletion of descent-to-delete vs an exact retrain (gradient evaluations and wall time).

    python -m bench.performance.d2d_cost            # n = 1e3, 1e4, 1e5 at d = 16, logistic, eps = 1, delta = 1e-6

One gradient evaluation = one example's gradient.  A deletion costs n_i * T_i (T_i = I, or the Thm 3.2 / 3.5
counts); a retrain costs n * T with T = I + log(D m n / 2L) / log(1/gamma).  The distributed variant's numbers are
the paper's budget (C copies x n T_i per update vs C B T for training); it is measured at n = 1e3 only (its
training at n = 1e5 is ~1e9 gradient evaluations) and computed from the formulas above that.
"""
from __future__ import annotations

import time

import numpy as np

from app.unlearning.contract.spec import ModelSpec
from app.unlearning.contract.unlearner import ArrayRetained
from app.unlearning.families.descent_to_delete import DescentToDelete

D_FEATURES = 16
VARIANTS = ("secret", "perfect", "regularized_strong", "regularized_weak", "distributed")


def spec_for(variant: str) -> ModelSpec:
    l2 = 0.0 if variant.startswith("regularized") else 0.01
    return ModelSpec("descent_to_delete", "logistic", D_FEATURES, 1.0, 1.0, 10.0, l2, 1.0, 1e-6, 0.1,
                     {"variant": variant, "retrain_when_cheaper": False})


def data(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, D_FEATURES))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (X @ rng.normal(size=D_FEATURES) + 0.5 * rng.normal(size=n) > 0).astype(float)
    return X, y


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"d = {D_FEATURES} (+ bias), logistic, eps = 1, delta = 1e-6, x_norm = 1, R = 10, l2 = 0.01 (0 + m for the "
          "regularized variants)")
    print(f"{'n':>7} {'variant':<19} {'I':>5} {'T':>6} {'T_1':>6} {'del grads':>12} {'retrain grads':>14} "
          f"{'ratio':>8} {'del s':>8} {'retrain s':>9}")
    for n in (10**3, 10**4, 10**5):
        X, y = data(n, rng)
        store = ArrayRetained(np.arange(1, n + 1), X, y)
        for variant in VARIANTS:
            eng = DescentToDelete(spec_for(variant))
            measure = variant != "distributed" or n <= 10**3
            if measure:
                t0 = time.perf_counter()
                eng.learn(X, y, None)
                t_fit = time.perf_counter() - t0
                g0 = eng.grad_evals
                t0 = time.perf_counter()
                eng.forget([1], store)
                t_del = time.perf_counter() - t0
                del_grads, fit_grads = eng.grad_evals - g0, g0
            else:
                eng.n_epoch = eng.n_current = n  # constants only: the public formulas, no training
                eng.m_reg = eng._regularization_for(n)
                eng._configure()
                del_grads, fit_grads, t_del, t_fit = eng.update_cost(1, n - 1), eng.training_cost(n), float("nan"), float("nan")
            Ti = eng.update_iterations(1) if variant != "distributed" else 0
            label = variant + ("" if measure else " (formula)")
            print(f"{n:>7} {label:<19} {eng.I:>5} {eng.T:>6} {Ti:>6} {del_grads:>12.3g} {fit_grads:>14.3g} "
                  f"{del_grads / fit_grads:>8.3f} {t_del:>8.3f} {t_fit:>9.3f}")
        weak = DescentToDelete(spec_for("regularized_weak"))
        weak.n_epoch = n
        weak.m_reg = weak._regularization_for(n)
        weak._configure()
        switch = next(i for i in range(1, 10**6) if weak.update_cost(i, n) >= weak.training_cost(n))
        print(f"{'':>7} regularized_weak: T_i = i^2 I exceeds a retrain at update i = {switch} "
              "(retrain_when_cheaper switches to an exact refit there)")


if __name__ == "__main__":
    main()
