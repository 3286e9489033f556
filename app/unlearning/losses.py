"""L2-regularised losses on augmented features x~ = (x, 1) with public constants from declared bounds.

f(theta; x, y) = l(theta . x~, y) + (mu/2) ||theta||^2 on K = {||theta|| <= R}.  With ||x|| <= X the augmented
norm is X~ = sqrt(X^2 + 1) (inflated by the input tolerance), and for every theta in K:
  logistic (y in {0,1}):  ||grad|| <= X~ + mu R,                        beta = X~^2/4 + mu
  squared:                ||grad|| <= (R X~ + Y) X~ + mu R,             beta = X~^2 + mu
  huber (delta_h):        ||grad|| <= min(delta_h, R X~ + Y) X~ + mu R, beta = X~^2 + mu
The constants are what the certificates use (digest 000 §2.0, pitfall P6): they never look at the data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .base import BOUND_TOLERANCE, InputError, SpecError


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


@dataclass(frozen=True)
class Loss:
    name: str
    x_norm: float
    y_abs: float
    radius: float
    mu: float
    huber_delta: float = 1.0

    @property
    def feature_bound(self) -> float:
        """Bound on ||(x, 1)|| for every accepted input."""
        return math.sqrt((self.x_norm * (1.0 + BOUND_TOLERANCE)) ** 2 + 1.0)

    def _residual_bound(self) -> float:
        X = self.feature_bound
        if self.name == "logistic":
            return 1.0
        bound = self.radius * X + self.y_abs * (1.0 + BOUND_TOLERANCE)
        if self.name == "huber":
            return min(self.huber_delta, bound)
        return bound

    @property
    def lipschitz(self) -> float:
        return self._residual_bound() * self.feature_bound + self.mu * self.radius

    @property
    def smoothness(self) -> float:
        X2 = self.feature_bound**2
        return (X2 / 4.0 if self.name == "logistic" else X2) + self.mu

    # ---- labels ---------------------------------------------------------------------------
    def normalize_labels(self, y: np.ndarray) -> np.ndarray:
        if self.name == "logistic":
            ok = (y == 0) | (y == 1) | (y == -1)
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                raise InputError(f"example {i}: logistic labels must be 0/1 (or -1/+1)", index=i)
            return np.where(y == -1, 0.0, y)
        over = np.abs(y) > self.y_abs * (1.0 + BOUND_TOLERANCE)
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise InputError(f"example {i}: |y| = {abs(y[i]):.6g} above the declared bound y_abs={self.y_abs}", index=i)
        return y

    # ---- maths ------------------------------------------------------------------------------
    def residual(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        """d l / d score."""
        if self.name == "logistic":
            return _sigmoid(scores) - y
        r = scores - y
        if self.name == "huber":
            return np.clip(r, -self.huber_delta, self.huber_delta)
        return r

    def grad(self, theta: np.ndarray, x_aug: np.ndarray, y: float) -> np.ndarray:
        """Gradient of one regularised example at theta (x_aug includes the trailing 1)."""
        r = self.residual(np.asarray(x_aug @ theta), np.asarray(y))
        return float(r) * x_aug + self.mu * theta

    def mean_grad(self, theta: np.ndarray, X_aug: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = self.residual(X_aug @ theta, y)
        return X_aug.T @ r / len(y) + self.mu * theta

    def losses(self, theta: np.ndarray, X_aug: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-example regularised loss values (for regret tables)."""
        s = X_aug @ theta
        if self.name == "logistic":
            base = np.logaddexp(0.0, s) - y * s
        elif self.name == "squared":
            base = 0.5 * (s - y) ** 2
        else:
            r = np.abs(s - y)
            d = self.huber_delta
            base = np.where(r <= d, 0.5 * r**2, d * (r - 0.5 * d))
        return base + 0.5 * self.mu * float(theta @ theta)

    def predict(self, scores: np.ndarray) -> np.ndarray:
        if self.name == "logistic":
            return (scores > 0).astype(np.float64)
        return scores

    def score_output(self, scores: np.ndarray) -> np.ndarray:
        """What the API calls 'scores': class-1 probability for logistic, the raw value otherwise."""
        return _sigmoid(scores) if self.name == "logistic" else scores


LOSSES = ("logistic", "squared", "huber")


def make_loss(name: str, x_norm: float, y_abs: float, radius: float, mu: float, hp: Mapping[str, Any]) -> Loss:
    if name not in LOSSES:
        raise SpecError(f"unknown loss {name!r}; expected one of {', '.join(LOSSES)}")
    delta = float(hp.get("huber_delta", 1.0))
    if not (delta > 0 and math.isfinite(delta)):
        raise SpecError("huber_delta must be a positive number")
    return Loss(name, float(x_norm), float(y_abs), float(radius), float(mu), delta)


def augment(X: np.ndarray) -> np.ndarray:
    return np.hstack([X, np.ones((X.shape[0], 1))])
