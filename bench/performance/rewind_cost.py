"""Cost of rewind_to_delete per deletion vs full retraining (python -m bench.performance.rewind_cost; well under a minute).

For n = 1e3, 1e4, 1e5 records at d = 16 (logistic, l2 = 0.01, PSGD-R2D strongly convex, b = 32) and two training
lengths -- a fixed T = 2000 and T = 2 epochs (2n/b) -- with K = T/8, it reports per-example gradient evaluations
(SGD: steps x b; the deletion also streams the n - m retained records once to materialise D') and wall time of
one deletion (rewind + K steps + fresh noise) against an exact retrain (T steps), plus the calibrated Sigma and sigma.
"""
from __future__ import annotations

import time

import numpy as np

from app.unlearning.contract.spec import ModelSpec
from app.unlearning.contract.unlearner import ArrayRetained
from app.unlearning.families.rewind import RewindToDelete


def run(n: int, T: int, d: int = 16, b: int = 32, reps: int = 3) -> dict:
    rng = np.random.default_rng(n)
    X = rng.normal(size=(n, d))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (X @ rng.normal(size=d) + 0.3 * rng.normal(size=n) > 0).astype(float)
    K = max(1, T // 8)
    hp = {"T": T, "K": K, "batch_size": b, "m_max": 10, "initial_size": n}
    spec = ModelSpec("rewind_to_delete", "logistic", d, 1.0, 1.0, 10.0, 0.01, 1.0, 1e-6, 0.0, hp)
    e = RewindToDelete(spec)
    t0 = time.perf_counter()
    steps = e.learn(X, y, None)
    t_train = time.perf_counter() - t0
    store_steps, held = np.asarray(steps), np.ones(n, dtype=bool)
    t_del = []
    for i in range(reps):
        store = ArrayRetained(store_steps[held], X[held], y[held])
        t0 = time.perf_counter()
        e.forget([int(store_steps[i])], store)
        t_del.append(time.perf_counter() - t0)
        held[i] = False
    t0 = time.perf_counter()
    e.retrain(ArrayRetained(store_steps[held], X[held], y[held]))
    t_retrain = time.perf_counter() - t0
    return {"n": n, "T": T, "K": K, "grad_train": T * b, "grad_delete": K * b, "rows_streamed": n,
            "t_train": t_train, "t_delete": float(np.median(t_del)), "t_retrain": t_retrain,
            "Sigma": e.sensitivity, "sigma": e.sigma}


def main() -> None:
    print(f"{'n':>7} {'T':>6} {'K':>5} {'grads/del':>10} {'grads/retrain':>13} {'ms/del':>8} {'ms/retrain':>10} "
          f"{'speed-up':>8} {'Sigma':>10} {'sigma':>10}")
    start = time.perf_counter()
    for n in (1_000, 10_000, 100_000):
        for T in (2000, max(1, 2 * n // 32)):
            r = run(n, T)
            print(f"{r['n']:>7} {r['T']:>6} {r['K']:>5} {r['grad_delete']:>10} {r['grad_train']:>13} "
                  f"{1e3 * r['t_delete']:>8.1f} {1e3 * r['t_retrain']:>10.1f} {r['t_retrain'] / r['t_delete']:>8.1f} "
                  f"{r['Sigma']:>10.3g} {r['sigma']:>10.3g}")
    print("(d=16, b=32, K=T/8, PSGD-R2D strongly convex, logistic l2=0.01, eps=1, delta=1e-6 total)")
    print()
    Ts = (2_000, 20_000, 200_000)
    print("K needed for sigma <= target (m_max = 10, eta = mu/L^2): Corollary 2.1, K stops growing with T; "
          "K = T means 'no cheaper than retraining'")
    print(f"{'delta':>7} {'target':>7} {'n':>7} " + " ".join(f"{'T=' + str(T):>9}" for T in Ts))
    for delta in (1e-6, 1e-2):
        for target in (1.0, 0.1):
            for n in (1_000, 10_000, 100_000):
                ks = []
                for T in Ts:
                    hp = {"T": T, "batch_size": 32, "m_max": 10, "initial_size": n, "sigma_target": target}
                    spec = ModelSpec("rewind_to_delete", "logistic", 16, 1.0, 1.0, 10.0, 0.01, 1.0, delta, 0.0, hp)
                    e = RewindToDelete(spec)
                    ks.append(e.min_K(n, e.capacity_for(n), target))
                print(f"{delta:>7g} {target:>7g} {n:>7} " + " ".join(f"{k:>9}" for k in ks))
    print(f"total {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
