"""What both tables of ``python -m bench.regret`` share (bench/regret/regret.py's first table, bench/regret/regret_table1.py's Table
1): the model's regulariser and domain, the deletion schedule and the OLU comparator losses."""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize

from app.unlearning.contract.spec import ModelSpec
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.maths.losses import augment

MU, RADIUS = 0.01, 12.0  # l2 = mu and the radius of K (every comparator below is an interior point)


def scoring_loss(dim: int):
    """The loss every family is scored with (declared l2 = MU, whatever surrogate it trains on): passive OLU's
    logistic loss on the unit ball of features (bench/regret/regret.py's spec: epsilon = 1, delta = 1e-6, rho = 0.01747)."""
    return PassiveOLU(ModelSpec("passive_olu", "logistic", dim, 1.0, 1.0, RADIUS, MU, 1.0, 1e-6, 0.01747, {})).loss


def schedule(T: int, k: int) -> list[tuple[int, int]]:
    """k deletion events (tau_i, u_i): at tau_i = round(i T/(k+1)), forget the middle record u_i of block i
    (both tables of bench.regret)."""
    taus = [round(i * T / (k + 1)) for i in range(1, k + 1)]
    out, prev = [], 0
    for tau in taus:
        out.append((tau, prev + math.ceil((tau - prev) / 2)))
        prev = tau
    return out


def comparators(X, y, events) -> np.ndarray:
    """Per-step comparator losses f_t(z*_i) for the OLU regret."""
    T, d = X.shape
    Xa = augment(X)
    loss = scoring_loss(d)
    w = np.ones(T)
    bounds = [0] + [tau for tau, _ in events] + [T]
    theta = np.zeros(d + 1)
    comp = np.empty(T)
    for i in range(len(events) + 1):
        if i > 0:
            w[events[i - 1][1] - 1] = 0.0

        def F(th, w=w):
            s = Xa @ th
            val = np.sum(w * (np.logaddexp(0.0, s) - y * s)) + 0.5 * MU * w.sum() * th @ th
            r = w * (0.5 * (1.0 + np.tanh(0.5 * s)) - y)
            return val, Xa.T @ r + MU * w.sum() * th

        theta = minimize(F, theta, jac=True, method="L-BFGS-B", options={"gtol": 1e-10, "maxiter": 5000}).x
        assert np.linalg.norm(theta) <= RADIUS
        lo, hi = bounds[i], bounds[i + 1]
        comp[lo:hi] = loss.losses(theta, Xa[lo:hi], y[lo:hi])
    return comp
