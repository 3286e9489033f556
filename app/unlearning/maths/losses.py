"""L2-regularised losses on augmented features x~ = (x, 1) with public constants from declared bounds.

f(theta; x, y) = l(theta . x~, y) + (mu/2) ||theta||^2 on K = {||theta|| <= R}.  With ||x|| <= X the augmented
norm is X~ = sqrt(X^2 + 1) (inflated by the input tolerance), and for every theta in K:
  logistic (y in {0,1}):  ||grad|| <= X~ + mu R,                        beta = X~^2/4 + mu
  squared:                ||grad|| <= (R X~ + Y) X~ + mu R,             beta = X~^2 + mu
  huber (delta_h):        ||grad|| <= min(delta_h, R X~ + Y) X~ + mu R, beta = X~^2 + mu
The constants are what the certificates use (digest 000 §2.0, pitfall P6): they never look at the data.

Softmax (multinomial logistic regression, K >= 2 classes declared at creation, labels y in {0..K-1}).
Parameters Theta in R^{K x (d+1)} (row k = weights and bias of class k), flattened row-major into theta of length
K (d+1), so ||theta|| = ||Theta||_F and every family's l2 sensitivity / noise / projection over "all parameters"
carries over unchanged; K = {||Theta||_F <= R}.  Scores s = Theta x~ (a K-vector), p = softmax(s),
  f(Theta; x, y) = lse(s) - s_y + (mu/2) ||Theta||_F^2.
* Gradient: grad = (p - e_y) x~^T + mu Theta (an outer product), so ||grad||_F <= ||p - e_y|| ||x~|| + mu R.
  ||p - e_y||^2 = (1 - p_y)^2 + sum_{k != y} p_k^2 <= (1 - p_y)^2 + (sum_{k != y} p_k)^2 = 2 (1 - p_y)^2 < 2, so
      L = sqrt(2) X~ + mu R     (the sup sqrt(2) is approached as p concentrates on one class k != y).
* Smoothness: grad^2 = A(p) (x) x~ x~^T + mu I with A(p) = diag(p) - p p^T (Kronecker product, row-major
  flattening), so lambda_max = lambda_max(A) ||x~||^2 + mu.  Gershgorin: row k of A has diagonal p_k (1 - p_k)
  and off-diagonal absolute sum p_k sum_{j != k} p_j = p_k (1 - p_k), so lambda_max(A) <= 2 p_k (1 - p_k) <= 1/2
  (attained at p = (1/2, 1/2, 0, ...): A = [[1/4, -1/4], [-1/4, 1/4]] has eigenvalue 1/2; Boehning 1992, Ann. Inst.
  Statist. Math. 44, shows the matrix bound A <= (1/2)(I - 1 1^T / K) used in multinomial MM algorithms), hence
      beta = X~^2 / 2 + mu.
  A is positive semi-definite (v^T A v = Var_p(v) >= 0) with A 1 = 0: the data term is convex but NOT strongly
  convex (flat along Theta -> Theta + 1 c^T); strong convexity mu comes from the (mu/2) ||Theta||_F^2 regulariser
  alone, so the families that need mu > 0 need l2 > 0 (as for the logistic loss).
* Hessian-Lipschitz (second_order_olu): the third derivative of lse at s is the symmetric 3-tensor
  T[h, h, h] = E_p[(h_Z - E_p h_Z)^3] (third central moment of h under p).  |T[h,h,h]| <= max_k |h_k - E_p h|
  Var_p(h) <= sqrt(2) ||h|| * ||h||^2 / 2 (each |h_k - h_j| <= sqrt(2) ||h||, Var_p(h) = h^T A h <= ||h||^2/2), and
  for a symmetric trilinear form on a Hilbert space sup_{|a|=|b|=|c|=1} T[a,b,c] = sup_{|h|=1} |T[h,h,h]|
  (Banach 1938), so ||A(s) - A(s')||_op <= ||s - s'|| / sqrt(2); with ||s - s'|| <= ||Theta - Theta'||_F ||x~||,
      M = X~^3 / sqrt(2).
* Losses at Theta = 0: lse(0) = log K (ERM bound (mu/2)||Theta_S||^2 <= log K).
tests/test_softmax.py checks every bound numerically (hypothesis, incl. adversarial points near each bound).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..contract.errors import InputError, SpecError, checkpoint
from ..contract.spec import BOUND_TOLERANCE


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
    n_classes: int = 0  # K: softmax, or a least-squares classifier (loss squared with classes, exact_ridge)

    @property
    def n_out(self) -> int:
        """Scores per example: K for a classifier (softmax), 1 otherwise."""
        return self.n_classes or 1

    def n_params(self, dim: int) -> int:
        """Length of the flattened parameter vector: n_out (d + 1)."""
        return self.n_out * (dim + 1)

    @property
    def feature_bound(self) -> float:
        """Bound on ||(x, 1)|| for every accepted input."""
        return math.sqrt((self.x_norm * (1.0 + BOUND_TOLERANCE)) ** 2 + 1.0)

    def _residual_bound(self) -> float:
        X = self.feature_bound
        if self.name == "logistic":
            return 1.0
        if self.name == "softmax":
            return math.sqrt(2.0)  # sup ||p - e_y|| (module docstring)
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
        if self.name == "softmax":
            return X2 / 2.0 + self.mu  # lambda_max(diag p - p p^T) <= 1/2 (module docstring)
        return (X2 / 4.0 if self.name == "logistic" else X2) + self.mu

    @property
    def loss_at_zero(self) -> float:
        """sup over accepted examples of the unregularised loss at theta = 0 (ERM norm bounds)."""
        y = self.y_abs * (1.0 + BOUND_TOLERANCE)
        if self.name == "logistic":
            return math.log(2.0)
        if self.name == "softmax":
            return math.log(self.n_classes)
        if self.name == "squared":
            return 0.5 * y**2
        d = self.huber_delta
        return 0.5 * y**2 if y <= d else d * (y - 0.5 * d)

    @property
    def data_grad_bound(self) -> float | None:
        """sup ||grad of the unregularised loss|| over all parameters (None when unbounded: squared)."""
        X = self.feature_bound
        if self.name == "squared":
            return None
        return X * {"logistic": 1.0, "softmax": math.sqrt(2.0)}.get(self.name, self.huber_delta)

    # ---- labels ---------------------------------------------------------------------------
    def normalize_labels(self, y: np.ndarray) -> np.ndarray:
        if self.n_classes:  # softmax, or a least-squares classifier
            ok = (y == np.floor(y)) & (y >= 0) & (y < self.n_classes)
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                kind = "softmax labels" if self.name == "softmax" else "class labels"
                raise InputError(f"example {i}: {kind} must be class indices 0..{self.n_classes - 1} "
                                 "(or declared class names)", index=i, code="invalid-label")
            return y
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
    # Every method below takes the flattened parameter vector theta (length n_params); for softmax it is
    # Theta (K x (d+1)) row-major.  The scalar losses keep their original arithmetic exactly.
    def _probs(self, theta: np.ndarray, X_aug: np.ndarray) -> np.ndarray:
        """softmax(X_aug Theta^T) row-wise (n x K), stabilised by the row max."""
        S = X_aug @ theta.reshape(self.n_classes, -1).T
        S = S - S.max(axis=1, keepdims=True)
        E = np.exp(S)
        return E / E.sum(axis=1, keepdims=True)

    def _softmax_residual(self, theta: np.ndarray, X_aug: np.ndarray, y: np.ndarray) -> np.ndarray:
        """P - onehot(y) (n x K): the derivative of the data term with respect to the scores."""
        P = self._probs(theta, X_aug)
        P[np.arange(len(P)), np.asarray(y, dtype=np.int64)] -= 1.0
        return P

    def grad_sum(self, theta: np.ndarray, X_aug: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Sum over the rows of the data-term gradients (no regulariser)."""
        checkpoint()  # every gradient is a point where an abandoned computation stops (issue 29)
        if self.name == "softmax":
            return (self._softmax_residual(theta, X_aug, y).T @ X_aug).ravel()
        return X_aug.T @ self.residual(X_aug @ theta, y)

    def hessian_parts(self, theta: np.ndarray, X_aug: np.ndarray) -> np.ndarray:
        """What ``hvp_sum`` / ``hessian_sum`` need at theta: phi''(score) (n,) for logistic and squared (1), the
        class probabilities p (n x K) for softmax.  Huber has no second derivative at |r| = delta_h (second_order_olu,
        the only caller, refuses it)."""
        if self.name == "softmax":
            return self._probs(theta, X_aug)
        s = X_aug @ theta
        if self.name == "logistic":
            q = 0.5 * (1.0 + np.tanh(0.5 * s))
            return q * (1.0 - q)
        return np.ones_like(s)

    def hvp_sum(self, X_aug: np.ndarray, parts: np.ndarray, v: np.ndarray) -> np.ndarray:
        """sum_i grad^2 l_i v (data term) from ``hessian_parts``: softmax (A(p_i) V x~_i) x~_i^T."""
        checkpoint()
        if self.name == "softmax":
            U = X_aug @ v.reshape(self.n_classes, -1).T          # n x K: V x~_i
            W = parts * U - parts * (parts * U).sum(axis=1, keepdims=True)  # A(p_i) u_i
            return (W.T @ X_aug).ravel()
        return X_aug.T @ (parts * (X_aug @ v))

    def hessian_sum(self, X_aug: np.ndarray, parts: np.ndarray) -> np.ndarray:
        """sum_i grad^2 l_i (data term) as a dense n_params x n_params matrix."""
        if self.name == "softmax":
            K, q = self.n_classes, X_aug.shape[1]
            H = np.zeros((K, q, K, q))
            for k in range(K):
                for j in range(k, K):
                    w = parts[:, k] * ((1.0 if j == k else 0.0) - parts[:, j])
                    blk = (X_aug * w[:, None]).T @ X_aug
                    H[k, :, j, :] = blk
                    if j != k:
                        H[j, :, k, :] = blk.T
            return H.reshape(K * q, K * q)
        return (X_aug * parts[:, None]).T @ X_aug

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
        checkpoint()
        if self.name == "softmax":
            r = self._softmax_residual(theta, x_aug[None, :], np.asarray([y]))[0]
            return np.outer(r, x_aug).ravel() + self.mu * theta
        r = self.residual(np.asarray(x_aug @ theta), np.asarray(y))
        return float(r) * x_aug + self.mu * theta

    def mean_grad(self, theta: np.ndarray, X_aug: np.ndarray, y: np.ndarray) -> np.ndarray:
        checkpoint()
        if self.name == "softmax":
            return self.grad_sum(theta, X_aug, y) / len(y) + self.mu * theta
        r = self.residual(X_aug @ theta, y)
        return X_aug.T @ r / len(y) + self.mu * theta

    def losses(self, theta: np.ndarray, X_aug: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-example regularised loss values (for regret tables)."""
        if self.name == "softmax":
            S = X_aug @ theta.reshape(self.n_classes, -1).T
            m = S.max(axis=1)
            lse = m + np.log(np.exp(S - m[:, None]).sum(axis=1))
            base = lse - S[np.arange(len(S)), np.asarray(y, dtype=np.int64)]
            return base + 0.5 * self.mu * float(theta @ theta)
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

    def linear_scores(self, theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Scores of raw (un-augmented) features: (n,) or, softmax, (n x K)."""
        if self.name == "softmax":
            W = theta.reshape(self.n_classes, -1)
            return X @ W[:, :-1].T + W[:, -1]
        return X @ theta[:-1] + theta[-1]

    @property
    def predicts_labels(self) -> bool:
        """Whether its predictions are class labels (logistic 0/1, a classifier's index), served as integers."""
        return self.name in ("logistic", "softmax") or bool(self.n_classes)

    def predict(self, scores: np.ndarray) -> np.ndarray:
        if self.name == "softmax":
            return np.argmax(scores, axis=1).astype(np.float64)
        if self.name == "logistic":
            return (scores > 0).astype(np.float64)
        return scores

    def predict_output(self, out: np.ndarray) -> np.ndarray:
        """The prediction from an output of ``score_output`` (or a mean of several: an ensemble's): the class of
        largest probability (softmax), class 1 when its probability is above 1/2 (logistic), the value otherwise."""
        if self.name == "softmax":
            return np.argmax(out, axis=1).astype(np.float64)
        if self.name == "logistic":
            return (out > 0.5).astype(np.float64)
        return out

    def score_output(self, scores: np.ndarray) -> np.ndarray:
        """What the API calls 'scores': class-1 probability for logistic, the raw value otherwise; softmax: the
        class probabilities (n x K)."""
        if self.name == "softmax":
            S = scores - scores.max(axis=1, keepdims=True)
            E = np.exp(S)
            return E / E.sum(axis=1, keepdims=True)
        return _sigmoid(scores) if self.name == "logistic" else scores


LOSSES = ("logistic", "squared", "huber", "softmax")
MAX_CLASSES = 1000  # largest K a softmax model may declare


def make_loss(name: str, x_norm: float, y_abs: float, radius: float, mu: float, hp: Mapping[str, Any],
              n_classes: int = 0) -> Loss:
    if name not in LOSSES:
        raise SpecError(f"unknown loss {name!r}; expected one of {', '.join(LOSSES)}")
    delta = float(hp.get("huber_delta", 1.0))
    if not (delta > 0 and math.isfinite(delta)):
        raise SpecError("huber_delta must be a positive number")
    if name == "softmax":
        if not 2 <= int(n_classes) <= MAX_CLASSES:
            raise SpecError(f"loss softmax needs n_classes in [2, {MAX_CLASSES}]", fields=("n_classes",))
        return Loss(name, float(x_norm), float(y_abs), float(radius), float(mu), delta, int(n_classes))
    if name == "squared" and n_classes:  # a least-squares classifier (exact_ridge): labels are class indices
        return Loss(name, float(x_norm), float(y_abs), float(radius), float(mu), delta, int(n_classes))
    return Loss(name, float(x_norm), float(y_abs), float(radius), float(mu), delta)


def loss_of(spec: Any, hp: Mapping[str, Any] | None = None, extra_mu: float = 0.0) -> Loss:
    """The declared loss of a ModelSpec (l2 + ``extra_mu`` as mu)."""
    return make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2 + extra_mu,
                     spec.hyperparameters if hp is None else hp, spec.n_classes)


def augment(X: np.ndarray) -> np.ndarray:
    return np.hstack([X, np.ones((X.shape[0], 1))])
