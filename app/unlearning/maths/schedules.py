"""Step-size schedules with their per-step contraction gamma_t and sensitivity Delta_t = eta_t L.

Index convention (digest 000 §2.0): step t consumes example t with eta_t; a record learned at u and forgotten
after step tau carries the shift a = Delta_u * Gamma(u, tau), Gamma(u, tau) = prod_{r=u+1..tau} gamma_r.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np


class Schedule(ABC):
    name: str

    @abstractmethod
    def eta(self, t: int) -> float: ...

    @abstractmethod
    def gamma(self, t: int) -> float:
        """Contraction of step t of projected GD on a mu-strongly convex, beta-smooth loss."""

    def log_gamma_sum(self, u: int, tau: int) -> float:
        """log Gamma(u, tau) = sum_{r=u+1..tau} log gamma_r (generic O(tau - u) fallback)."""
        total = 0.0
        for r in range(u + 1, tau + 1):
            g = self.gamma(r)
            if g <= 0.0:
                return -math.inf
            total += math.log(g)
        return total

    def deletable(self, u: int) -> bool:
        """Whether the contraction analysis covers a record learned at step u (pitfall P3)."""
        return True

    def undeletable_prefix(self) -> float:
        """How many leading steps of the clock ``deletable`` rejects (it rejects exactly a prefix: 0 when every
        record is deletable, ``math.inf`` when none is), from public quantities only."""
        return 0

    def reset(self) -> None:
        """Restart the clock (restart variant); deterministic schedules have nothing to reset."""

    def state(self) -> dict:
        """Schedule state beyond the clock (adaptive step sizes); deterministic schedules have none."""
        return {}

    def load_state(self, state) -> None:
        pass


def contraction(eta: float, mu: float, beta: float) -> float:
    """Lemma D: gamma = max(|1 - eta mu|, |1 - eta beta|) for eta <= 2/beta."""
    return max(abs(1.0 - eta * mu), abs(1.0 - eta * beta))


class CappedStronglyConvex(Schedule):
    """eta_t = min(1/(mu t), 2/(beta + mu))  (digest 000 §2.4(f)).

    Capping keeps gamma_t = 1 - eta_t mu <= 1 at every step, so every record is deletable.  Steps
    t < t0 = ceil((beta + mu)/(2 mu)) use the constant step 2/(beta+mu) with gamma = (beta-mu)/(beta+mu);
    from t0 on, eta_t = 1/(mu t) and gamma_t = 1 - 1/t (000 Cor. 3.2), so Gamma has a closed form.
    """

    name = "strongly_convex_capped"

    def __init__(self, mu: float, beta: float):
        if not mu > 0:
            raise ValueError("the strongly convex schedule needs mu = l2 > 0")
        self.mu, self.beta = mu, beta
        self.cap = 2.0 / (beta + mu)
        self.t0 = max(1, math.ceil((beta + mu) / (2.0 * mu)))
        self.capped_gamma = (beta - mu) / (beta + mu)

    def eta(self, t: int) -> float:
        return self.cap if t < self.t0 else 1.0 / (self.mu * t)

    def gamma(self, t: int) -> float:
        return contraction(self.eta(t), self.mu, self.beta)

    def log_gamma_sum(self, u: int, tau: int) -> float:
        if tau <= u:
            return 0.0
        if u >= self.t0:  # the branch below with n_capped = 0, a = u + 1: Gamma = prod (1 - 1/r) = u/tau (000 Cor. 3.2)
            return math.log(u / tau)
        total = 0.0
        n_capped = max(0, min(tau, self.t0 - 1) - u)  # r in (u, tau] with r < t0
        if n_capped:
            if self.capped_gamma <= 0.0:
                return -math.inf
            total += n_capped * math.log(self.capped_gamma)
        a = max(u + 1, self.t0)  # prod_{r=a..tau} (1 - 1/r) = (a - 1)/tau, with gamma_r = max(|1-1/r|, |1-beta/(mu r)|)
        if a <= tau:
            # for r >= t0, beta/(mu r) <= (beta+mu)/... ensures |1 - beta/(mu r)| <= 1 - 1/r (000 Cor. 3.2)
            total += math.log((a - 1) / tau)
        return total


def _log(g: float) -> float:
    return math.log(g) if g > 0.0 else -math.inf


class StronglyConvex(Schedule):
    """eta_t = 1/(mu t), gamma_t = max(|1 - 1/t|, |1 - beta/(mu t)|)  (000 Cor. 3.2 / Thm 3.3, digest §2.4(a)).

    Early steps t < (1 + beta/mu)/2 are expansive relative to 1 - 1/t (gamma_t may exceed 1, pitfall P3).
    ``log_gamma_sum`` always multiplies the true per-step factors (a valid bound for any u), but the service
    enforces the paper's rule u > 1/2 + beta/(2 mu) (``deletable``): below it the noise would be enormous and
    the theorem does not cover it.  For deletable u, Gamma(u, tau) = u / tau exactly.
    """

    name = "strongly_convex"

    def __init__(self, mu: float, beta: float):
        if not mu > 0:
            raise ValueError("the strongly convex schedule needs mu > 0")
        self.mu, self.beta = mu, beta
        self.threshold = 0.5 + beta / (2.0 * mu)
        # from r_star on, |1 - beta/(mu r)| <= 1 - 1/r; one extra step of margin against float round-off
        self.r_star = max(2, math.ceil((1.0 + beta / mu) / 2.0) + 1)

    def eta(self, t: int) -> float:
        return 1.0 / (self.mu * t)

    def gamma(self, t: int) -> float:
        return contraction(self.eta(t), self.mu, self.beta)

    def log_gamma_sum(self, u: int, tau: int) -> float:
        if tau <= u:
            return 0.0
        total = 0.0
        a = max(u + 1, self.r_star)
        if a - 1 > u:  # the early, possibly expansive factors, one by one
            r = np.arange(u + 1, min(tau, a - 1) + 1, dtype=np.float64)
            eta = 1.0 / (self.mu * r)
            g = np.maximum(np.abs(1.0 - eta * self.mu), np.abs(1.0 - eta * self.beta))
            with np.errstate(divide="ignore"):
                total += float(np.sum(np.log(g)))
        if a <= tau:
            total += math.log((a - 1) / tau)  # prod_{r=a..tau} (1 - 1/r) = (a - 1)/tau
        return total

    def deletable(self, u: int) -> bool:
        return u > self.threshold

    def undeletable_prefix(self) -> float:
        return max(0, math.floor(self.threshold))  # u <= threshold is not deletable


class ConstantStep(Schedule):
    """Constant eta <= 2/beta (001 Cor. 1 / 000 Cor. 3.2): gamma = max(|1 - eta mu|, |1 - eta beta|) <= 1.

    With mu = 0 (merely convex) gamma = 1 and Delta = eta L never decays; every record is deletable.
    """

    name = "convex_constant"

    def __init__(self, eta: float, mu: float, beta: float):
        if not (0.0 < eta <= 2.0 / beta * (1.0 + 1e-12)):
            raise ValueError("the constant step must satisfy 0 < eta <= 2/beta")
        self.step_size, self.mu, self.beta = eta, mu, beta
        self.g = min(1.0, contraction(eta, mu, beta))

    def eta(self, t: int) -> float:
        return self.step_size

    def gamma(self, t: int) -> float:
        return self.g

    def log_gamma_sum(self, u: int, tau: int) -> float:
        if tau <= u:
            return 0.0
        return (tau - u) * _log(self.g)


class Adaptive(Schedule):
    """AdaGrad-norm step eta_t = D / sqrt(p(t)), p(t) = p0 + sum_{s<=t} ||grad f_s(z_s)||^2 (001 Thm 4, 000 Thm 3.5).

    The step sizes depend on the data; the analysis treats the gradient norms (hence every eta_t) as public,
    so the step sizes are stored per (local) step and the reference run uses the same ones.  gamma_t = 1 when
    eta_t <= 2/beta (non-expansive projected GD on a convex beta-smooth loss); otherwise the true Lipschitz factor
    eta_t beta - 1 > 1 is reported.  ``capped`` clips eta_t at 2/beta so every record is deletable; uncapped,
    a record is deletable iff eta_u <= 2/beta, i.e. p(u) >= beta^2 D^2 / 4 (digest §2.4(d), corrected: the
    printed p(u0) >= beta^2/4 omits D^2).  eta is non-increasing, so eta_u <= 2/beta covers every later step.
    """

    name = "adaptive"

    def __init__(self, D: float, beta: float, p0: float, capped: bool, G: float = math.inf):
        if not p0 > 0:
            raise ValueError("adaptive schedule needs p0 > 0 (pitfall P11)")
        self.D, self.beta, self.p0, self.capped = D, beta, p0, capped
        self.G = G  # declared bound on the gradient norms (the loss's Lipschitz constant L)
        self.cap = 2.0 / beta
        self.reset()

    def reset(self) -> None:
        self.p = self.p0
        self.etas: list[float] = []
        self.last_expansive = 0  # the last step t with gamma_t > 1 (eta_t beta > 2), 0 if none

    def next_eta(self, grad_sq: float) -> float:
        """Account the gradient of the step about to be taken and return its eta (appended to the history)."""
        self.p += grad_sq
        eta = self.D / math.sqrt(self.p)
        if self.capped:
            eta = min(eta, self.cap)
        self.etas.append(eta)
        if abs(1.0 - eta * self.beta) > 1.0:
            self.last_expansive = len(self.etas)
        return eta

    def append(self, eta: float) -> None:
        """Record an externally given (public) step size: reference runs and skipped steps."""
        eta = float(eta)
        self.etas.append(eta)
        if abs(1.0 - eta * self.beta) > 1.0:
            self.last_expansive = len(self.etas)

    def current_eta(self) -> float:
        eta = self.D / math.sqrt(self.p)
        return min(eta, self.cap) if self.capped else eta

    def public_eta_bound(self) -> float:
        """An upper bound on eta_u of every deletable u from declared numbers only (issue 14: the eta_u themselves
        depend on the gradient norms, the forgotten record's included, and are never published): p(u) >= p0, and
        a deletable u has eta_u <= 2/beta (capped: always; uncapped: ``deletable``)."""
        return min(self.D / math.sqrt(self.p0), self.cap)

    def forget_gradient_norms(self) -> None:
        """After a deletion: p <- p0 + G^2 t (t = the steps of this epoch), its public bound (||grad|| <= G = L),
        so later steps no longer depend on the forgotten record's gradient norm (nor on any earlier one)."""
        if math.isfinite(self.G):
            self.p = self.p0 + self.G**2 * len(self.etas)

    def eta(self, t: int) -> float:
        return self.etas[t - 1]

    def gamma(self, t: int) -> float:
        return max(1.0, abs(1.0 - self.eta(t) * self.beta))

    def log_gamma_sum(self, u: int, tau: int) -> float:
        if tau <= u:
            return 0.0
        if u >= self.last_expansive:  # every factor of (u, tau] is max(1, |1 - eta beta|) = 1: the sum below is 0.0
            return 0.0
        e = np.asarray(self.etas[u:tau], dtype=np.float64)
        return float(np.sum(np.log(np.maximum(1.0, np.abs(1.0 - e * self.beta)))))

    def deletable(self, u: int) -> bool:
        """Decided from declared numbers only (issue 14): eta_u <= D/sqrt(p0) <= 2/beta covers every u (and every
        later step) whatever the gradients; otherwise whether eta_u <= 2/beta depends on the gradient norms, the
        forgotten records' included, and answering it would publish them, so no record is deletable."""
        return self.capped or self.D / math.sqrt(self.p0) <= self.cap * (1.0 + 1e-12)

    def undeletable_prefix(self) -> float:
        return 0 if self.deletable(1) else math.inf

    # public step-size history (float64 array) and the running p: part of the engine state
    def state(self) -> dict:
        return {"etas": np.asarray(self.etas, dtype=np.float64), "p": float(self.p)}

    def load_state(self, state) -> None:
        e = np.asarray(state["etas"], dtype=np.float64)
        self.etas = [float(v) for v in e]
        self.p = float(state["p"])
        expansive = np.flatnonzero(np.abs(1.0 - e * self.beta) > 1.0)
        self.last_expansive = int(expansive[-1]) + 1 if len(expansive) else 0
