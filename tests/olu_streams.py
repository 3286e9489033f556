"""Near-worst-case streams and engine factories shared by the passive-family replay tests.

The tight construction ("orthogonal probe"): logistic loss in d = 3 with ||x|| <= 2.  The probe direction is
x_p = (2, 0, 0), augmented (2, 0, 0, 1).  *Pushers* (x_p, label 0) drive the score along the probe far negative,
so a *probe record* (x_p, label 1) is badly misclassified and its gradient has norm close to L.  Every example
after the probe is *orthogonal* in augmented space, x = (-1/2, a, b) with a^2 + b^2 <= 15/4 (x~ . x~_p = 0), so
the difference the probe made moves only under the l2 term: it contracts by exactly 1 - eta_t mu per step, the
certified factor (or stays put when mu = 0).  Random data would be loose by orders of magnitude.
"""
from __future__ import annotations

import numpy as np

from app.unlearning.contract.spec import ModelSpec
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.families.restart import PassiveOLURestart

X_NORM = 2.0
PROBE = np.array([X_NORM, 0.0, 0.0])


def spec(schedule: str, l2: float = 0.01, rho: float = 1.0, radius: float = 20.0, algorithm: str = "passive_olu",
         loss: str = "logistic", x_norm: float = X_NORM, dim: int = 3, **hp) -> ModelSpec:
    return ModelSpec(algorithm, loss, dim, x_norm, 1.0, radius, l2, 1.0, 1e-6, rho, {"schedule": schedule, **hp})


def orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    ang = rng.uniform(0, 2 * np.pi, n)
    r = np.sqrt(X_NORM**2 - 0.25) * np.sqrt(rng.uniform(0, 1, n))
    return np.column_stack([np.full(n, -0.5), r * np.cos(ang), r * np.sin(ang)])


def probe_stream(n_push: int, n_after: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """(X, y, u): pushers, the probe record at step u = n_push + 1, then orthogonal examples."""
    rng = np.random.default_rng(seed)
    X = np.vstack([np.tile(PROBE, (n_push, 1)), PROBE[None, :], orthogonal(rng, n_after)])
    y = np.concatenate([np.zeros(n_push), [1.0], rng.integers(0, 2, n_after).astype(float)])
    return X, y, n_push + 1


def mixed_stream(rng: np.random.Generator, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Adversarial mixture for property tests: pushers, probes, orthogonal and random norm-bound examples."""
    kind = rng.integers(0, 4, T)
    X = np.empty((T, 3))
    y = np.empty(T)
    for s, k in enumerate(kind):
        if k == 0:
            X[s], y[s] = PROBE, 0.0
        elif k == 1:
            X[s], y[s] = PROBE, 1.0
        elif k == 2:
            X[s], y[s] = orthogonal(rng, 1)[0], float(rng.integers(0, 2))
        else:
            v = rng.normal(size=3)
            X[s], y[s] = X_NORM * v / np.linalg.norm(v), float(rng.integers(0, 2))
    return X, y


def under_noised(cls: type[PassiveOLU], factor: float = 0.1) -> type[PassiveOLU]:
    """Negative control: sigma/10 while claiming the same charge (the certified shift is scaled by 1/10)."""

    class UnderNoised(cls):  # type: ignore[misc, valid-type]
        def shift_bound(self, u, tau):
            d, g, a = super().shift_bound(u, tau)
            return d, g, a * factor

    return UnderNoised


def factory(s: ModelSpec, cls: type[PassiveOLU] | None = None):
    if cls is None:
        cls = PassiveOLURestart if s.algorithm == "passive_olu_restart" else PassiveOLU
    return lambda noise: cls(s, noise)


def max_ratio(points) -> float:
    return max((p.ratio for p in points), default=0.0)
