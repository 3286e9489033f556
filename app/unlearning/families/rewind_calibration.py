"""Rewind-to-delete's calibration (paper 004, Mu & Klabjan; digest descend-or-rewind.md §3): the sensitivity bound of
each variant and regime, the Gaussian noise scale that certifies it (analytic or classical), the step-size cap and
the constants B, C, ell0, and the hyperparameters, calibration checks and work of a spec. The engine's state,
training and forgetting are in rewind.py."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import log_ndtr

from ..contract.errors import SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import Unlearner
from ..maths import work_budget as wb
from ..maths.losses import make_loss
from ..mechanism.calibration import (N_MAX, Checks, common_checks, construct, noise_norm_bound, release_checks,
                                     update_norm_bound)

VARIANTS = ("rewind", "descend")

REGIMES = ("strongly_convex", "convex", "nonconvex")

LEARN_POLICIES = ("queue", "retrain")

CALIBRATIONS = ("analytic", "classical")
CHUNK = 8192  # examples per chunk of the pool the learner streams (its work counts in these)


# ---------------------------------------------------------------------------------------------------------
# Sensitivity bounds Sigma on E||theta''_K - theta'_T|| (R2D) or sqrt(E||.||^2) (D2D); digest §3
# ---------------------------------------------------------------------------------------------------------
def _one_minus_gamma(eta_mu: float) -> float:
    """1 - sqrt(1 - eta mu) without cancellation."""
    return eta_mu / (1.0 + math.sqrt(1.0 - eta_mu))


def _pow_diff(log_base: float, K: int, T: int) -> float:
    """base^K - base^T computed in log space (inf if it overflows: the bound is vacuous)."""
    try:
        return math.exp(K * log_base) - math.exp(T * log_base)
    except OverflowError:
        return math.inf


def psgd_r2d_sigma(regime: str, T: int, K: int, n: int, m: int, eta: float, L: float, G: float,
                   mu: float = 0.0, form: str = "appendix") -> float:
    """Theorem 2 via Theorem 18.  ``form="printed"`` gives the paper's (wrong) strongly convex constant."""
    if not 0 <= K <= T:
        raise SpecError("need 0 <= K <= T")
    if m == 0:
        return 0.0
    if regime == "nonconvex":
        lg = math.log1p(eta * L)
        return 2.0 * G * m * -_pow_diff(lg, K, T) / (n * L)
    if regime == "convex":
        return 2.0 * eta * G * m * (T - K) / n
    lg = 0.5 * math.log1p(-eta * mu)  # log gamma, gamma = sqrt(1 - eta mu)
    denom = mu if form == "printed" else _one_minus_gamma(eta * mu)
    return 2.0 * eta * G * m * _pow_diff(lg, K, T) / (n * denom)


def sgd_r2d_phi(T: int, K: int, n: int, m: int, eta: float, L: float, B: float, C: float, ell0: float) -> float:
    t = T - K
    return math.sqrt(3.0 * B * (2.0 * ell0 / eta + L * eta * C * t) * (3 * n - m) / (n - m)
                     + 6.0 * (4 * n - 3 * m) / (n - m) * C)


def sgd_r2d_sigma(regime: str, T: int, K: int, n: int, m: int, eta: float, L: float, B: float, C: float,
                  ell0: float, mu: float = 0.0, form: str = "appendix") -> float:
    """Theorem 3 via Theorem 22 (Phi does not vanish at m = 0: it bounds SGD noise, not just the bias)."""
    if not 0 <= K <= T:
        raise SpecError("need 0 <= K <= T")
    phi = sgd_r2d_phi(T, K, n, m, eta, L, B, C, ell0)
    if regime == "nonconvex":
        return -_pow_diff(math.log1p(eta * L), K, T) / L * phi
    if regime == "convex":
        return eta * (T - K) * phi
    lg = 0.5 * math.log1p(-eta * mu)
    if form == "printed":
        return _pow_diff(lg, K, T) / mu * phi
    return eta * _pow_diff(lg, K, T) / _one_minus_gamma(eta * mu) * phi


def d2d_sigma(T: int, K: int, eta: float, mu: float, L: float, B: float, C: float, ell0: float) -> float:
    """Theorem 4 for arbitrary T, K >= 0 (digest §3.6 general form, without merging C/(4B mu) + L eta C/mu).

    E||theta''_K - theta'_T||^2 <= (4/mu) [ell0 q^T (1 + q^K) + q^K (C/(4 B mu) + L eta C/mu) + L eta C/mu],
    q = 1 - eta mu / 2; requires eta <= 1/(B L) and m/n < 1/(6B + 1).  At T = K + T0 it is <= the printed Sigma^2.
    """
    q = 1.0 - 0.5 * eta * mu
    bias = C / (4.0 * B * mu) + L * eta * C / mu
    return math.sqrt(4.0 / mu * (ell0 * q**T * (1.0 + q**K) + q**K * bias + L * eta * C / mu))


def d2d_sigma_printed(K: int, eta: float, mu: float, L: float, B: float, C: float) -> float:
    """The paper's Theorem 4 Sigma (valid only with T >= K + T0)."""
    q = 1.0 - 0.5 * eta * mu
    return math.sqrt(5.0 * C / (mu**2 * B) * (q ** (2 * K) + 2.0 * q**K) + 4.0 * L * eta * C / mu**2)


# ---------------------------------------------------------------------------------------------------------
# Gaussian mechanism calibration
# ---------------------------------------------------------------------------------------------------------
def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest sigma with Phi(D/2s - e s/D) - e^e Phi(-D/2s - e s/D) <= delta (Balle & Wang 2018, Thm 8).

    Exact for every epsilon > 0 (the classical sqrt(2 ln(1.25/delta))/epsilon is proven for epsilon < 1 only).
    Returns the upper end of the bisection bracket, so the answer is never below the exact value.
    """
    if sensitivity == 0.0:
        return 0.0

    def excess(s: float) -> float:  # s = sigma / sensitivity
        a, b = 0.5 / s - epsilon * s, -0.5 / s - epsilon * s
        return math.exp(log_ndtr(a)) - math.exp(epsilon + log_ndtr(b)) - delta

    lo, hi = 1e-12, 1.0
    while excess(hi) > 0.0:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if excess(mid) > 0.0:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-12:
            break
    return hi * sensitivity


def gaussian_sigma(sensitivity: float, epsilon: float, delta: float, method: str) -> float:
    if method == "classical":
        if not epsilon < 1.0:
            raise SpecError("the classical Gaussian constant needs epsilon < 1; use calibration='analytic'")
        return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    return analytic_gaussian_sigma(sensitivity, epsilon, delta)


def _eta_max(regime: str, Ls: float, mu: float, B: float, projected: bool) -> float:
    """Largest step size the chosen theorem allows (digest pitfall 11)."""
    if regime == "strongly_convex":
        eta = mu / Ls**2
    elif regime == "convex":
        eta = 1.0 / Ls  # the theorems allow 2/L; 1/L keeps SGD in its descent regime
    else:
        eta = 1.0 / Ls
    if not projected and B > 0:
        eta = min(eta, 1.0 / (Ls * B))  # Lemma 20 (used by Theorems 3 and 4, not listed in Theorem 3)
    return eta


def _abc_constants(spec: ModelSpec, loss: Any, projected: bool) -> tuple[float, float, float]:
    """Data-independent (B, C, ell_theta0) of Assumptions 4 and 5 for the unprojected theorems.

    Per-sample (b = 1) second moment.  Each l_i is L-smooth and >= 0, so ||grad l_i||^2 <= 2L(l_i - l_i*), hence
    E_i||grad l_i||^2 <= 2L(L_D - L_D*) + 2L Delta_inf with Delta_inf <= L_D* <= ell_theta0.
    * mu > 0 (PL): L_D - L_D* <= ||grad L_D||^2/(2 mu)  =>  B = L/mu, C = 2 L ell_theta0.
    * mu = 0, logistic or huber: gradients are globally bounded by g_inf  =>  B = 0, C = g_inf^2.
    ell_theta0 bounds the loss at theta_0 = 0 for every admissible example.  Unused when projected.
    """
    X = loss.feature_bound
    y_abs = spec.y_abs * (1.0 + 1e-9)
    if loss.name == "logistic":
        ell0 = math.log(2.0)
    elif loss.name == "softmax":
        ell0 = math.log(loss.n_classes)  # lse(0) - 0 (losses.py)
    elif loss.name == "squared":
        ell0 = 0.5 * y_abs**2
    else:
        d = loss.huber_delta
        ell0 = 0.5 * y_abs**2 if y_abs <= d else d * (y_abs - 0.5 * d)
    if projected:
        return 0.0, 0.0, ell0
    Ls, mu = loss.smoothness, loss.mu
    if mu > 0:
        return Ls / mu, 2.0 * Ls * ell0, ell0
    if loss.name == "squared":
        raise SpecError("unprojected SGD with the squared loss needs l2 > 0 (no second-moment bound otherwise)")
    g_inf = loss.data_grad_bound if loss.name == "softmax" else X * (1.0 if loss.name == "logistic" else loss.huber_delta)
    return 0.0, g_inf**2, ell0


class RewindCalibration(Unlearner):
    """The calibration of ``RewindToDelete``: hyperparameters, checks, work, sensitivity and noise scale."""

    # ---- hyperparameters ------------------------------------------------------------------------------
    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = dict(spec.hyperparameters)
        allowed = {"variant", "projected", "regime", "T", "K", "batch_size", "eta", "m_max", "initial_size",
                   "learn_policy", "calibration", "huber_delta", "sigma_target"}
        unknown = set(hp) - allowed
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        hp.setdefault("variant", "rewind")
        if hp["variant"] not in VARIANTS:
            raise SpecError(f"variant must be one of {', '.join(VARIANTS)}")
        descend = hp["variant"] == "descend"
        hp.setdefault("projected", not descend)
        if not isinstance(hp["projected"], bool):
            raise SpecError("projected must be true or false")
        if descend and hp["projected"]:
            raise SpecError("variant 'descend' (SGD-D2D, Theorem 4) is unprojected; set projected=false")
        hp.setdefault("regime", "strongly_convex" if spec.l2 > 0 else "convex")
        if hp["regime"] not in REGIMES:
            raise SpecError(f"regime must be one of {', '.join(REGIMES)}")
        if hp["regime"] == "strongly_convex" and not spec.l2 > 0:
            raise SpecError("regime 'strongly_convex' needs l2 > 0 (mu = l2)")
        if descend and hp["regime"] != "strongly_convex":
            raise SpecError("variant 'descend' is certified for strongly convex losses only (Theorem 4)")
        # with sigma_target, K is chosen at training time (min_K) and never stored in the hyperparameters, so a
        # second normalisation of the normalised dict (as at creation) does not mistake a default K for a given one
        by_target = hp.get("sigma_target") is not None
        if by_target and hp.get("K") is not None:
            raise SpecError("give either K or sigma_target, not both")
        for key, default, low in (("T", 1000, 1), ("K", None, 0), ("batch_size", 32, 1), ("m_max", 10, 1),
                                  ("initial_size", 256, 2)):
            if key == "K" and by_target:
                hp.pop("K", None)
                continue
            if default is None:
                default = max(1, hp["T"] // 4)
            hp.setdefault(key, default)
            v = hp[key]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise SpecError(f"{key} must be an integer >= {low}")
            hp[key] = int(v)
        if not descend and not by_target and hp["K"] > hp["T"]:
            raise SpecError("rewind needs K <= T (K = T is retraining from theta_0)")
        target = hp.setdefault("sigma_target", None)
        if target is not None:
            if descend:
                raise SpecError("sigma_target is supported for variant 'rewind' only (D2D's Sigma has a floor)")
            try:
                target = float(target)
            except (TypeError, ValueError):
                raise SpecError("sigma_target must be a positive number") from None
            if not (target > 0 and math.isfinite(target)):
                raise SpecError("sigma_target must be a positive number")
            hp["sigma_target"] = target
        hp.setdefault("learn_policy", "queue")
        if hp["learn_policy"] not in LEARN_POLICIES:
            raise SpecError(f"learn_policy must be one of {', '.join(LEARN_POLICIES)}")
        hp.setdefault("calibration", "analytic")
        if hp["calibration"] not in CALIBRATIONS:
            raise SpecError(f"calibration must be one of {', '.join(CALIBRATIONS)}")
        if hp["calibration"] == "classical" and not spec.epsilon < 1.0:
            raise SpecError("calibration 'classical' needs epsilon < 1")
        if spec.loss == "huber":
            hp.setdefault("huber_delta", 1.0)
        loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
        Ls, mu = loss.smoothness, loss.mu
        B, _, _ = _abc_constants(spec, loss, hp["projected"])
        eta_max = _eta_max(hp["regime"], Ls, mu, B, hp["projected"])
        hp.setdefault("eta", eta_max)
        try:
            eta = float(hp["eta"])
        except (TypeError, ValueError):
            raise SpecError("eta must be a positive number") from None
        if not (eta > 0 and math.isfinite(eta)):
            raise SpecError("eta must be a positive number")
        if eta > eta_max * (1.0 + 1e-12):
            raise SpecError(f"eta = {eta:.6g} exceeds the step-size limit {eta_max:.6g} of the chosen regime")
        hp["eta"] = eta
        if hp["regime"] == "nonconvex" and hp["T"] * math.log1p(eta * Ls) > 700.0:
            raise SpecError("nonconvex bound (1 + eta L)^T overflows: the certificate is vacuous; lower eta*L*T")
        if not (0 < spec.delta < 1 and spec.epsilon > 0):
            raise SpecError("need epsilon > 0 and 0 < delta < 1")
        return hp

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """A training (every learn with learn_policy "retrain", a retrain; with "queue" the learn that reaches
        initial_size, fewer than initial_size records held before it): the pool's ids (reads every kept record), the
        T x batch_size sampled positions, the sampled rows (at most min(N, T b) records) and T SGD steps on
        minibatches of b; a forget: the pool and K steps from the secret start (K <= T when chosen by
        sigma_target).  N = max_records."""
        hp = spec.hyperparameters
        p, N, T, b = spec.n_params, int(hp.get("max_records") or batch), int(hp["T"]), int(hp["batch_size"])
        K = T if hp.get("K") is None else int(hp["K"])

        def run(steps: int, n: int) -> float:
            draws = steps * b
            return (wb.read(n, p, CHUNK) + wb.read(min(n, draws), p, 500)
                    + steps * (wb.STEP + b * wb.grad_flops(p) * wb.FLOP) + draws * 60.0 + wb.release(p))

        n_train = N + batch
        train = run(T, n_train)
        # learn_policy "queue": only the learn that brings the held records to initial_size trains, and before it
        # fewer than initial_size were held (rewind.py ``learn``): it reads those from the store, and its batch's rows
        # are sampled in memory (counted with the steps)
        learn = train if hp.get("learn_policy") == "retrain" else run(T, min(N, int(hp["initial_size"]) - 1))
        mem = wb.F64 * max(4.0 * T * b, 2.0 * min(n_train, T * b) * (p + 1))
        fields = ("hyperparameters.T", "hyperparameters.batch_size", "hyperparameters.max_records", "dim")
        learn_fields = fields if hp.get("learn_policy") == "retrain" else fields[:2] + ("hyperparameters.initial_size", "dim")
        return wb.Cost(learn=learn, forget=run(K, N), retrain=train, array_bytes=mem, learn_fields=learn_fields,
                       forget_fields=("hyperparameters.K", *fields), memory_fields=fields)

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """sigma of every epoch the model can train (Thms 2-4 via 18/22, Lemmas 13/14), at the sizes where it
        is largest (small n: the most deletions per record) and smallest (n = N_MAX): the sensitivity bound,
        its Markov tail, sigma finite and > 0 (rho = tail^2/(2 sigma^2)), the SGD step eta G, and the released
        theta + sigma z, whose scores X~ ||theta|| must stay finite."""
        checks = Checks(cls.algorithm)
        eng = construct(cls, spec)
        R, eps = spec.domain_radius, ("privacy.epsilon", "privacy.delta")
        common_checks(checks, eng.loss, spec)
        hp = ("hyperparameters.eta",) if "eta" in spec.hyperparameters else ()
        bounds = ("bounds.x_norm", "l2", "bounds.y_abs", "domain_radius", *hp)
        eta = checks.finite("eta", eng.eta, *hp, "bounds.x_norm", "l2", positive=True)
        checks.squared("eta G", eta * eng.G, *hp, "bounds.x_norm", "l2")
        for name, v in (("B", eng.B), ("C", eng.C), ("ell_theta0", eng.ell0)):
            checks.squared(name, v, "bounds.y_abs", "bounds.x_norm", "l2")
        theta = update_norm_bound(R, eta * eng.G) if eng.projected else R
        for n in sorted({1, 2, eng.initial_size, N_MAX}):
            cap = eng.capacity_for(n)
            K = (checks.call(f"K(n={n})", lambda: eng.min_K(n, cap, eng.sigma_target), *bounds, *eps)
                 if eng.sigma_target is not None else eng.K)
            sens = checks.finite(f"Sigma(n={n})", lambda: eng.sensitivity_bound(n, cap, K) if cap > 0 else 0.0,
                                  *bounds, *eps)
            sigma, tail = checks.call(f"sigma(n={n})", lambda: eng.noise_scale(sens), *eps, *bounds)
            checks.finite(f"tail(n={n})", tail, *eps, *bounds)
            checks.finite(f"sigma(n={n})", sigma, *eps, *bounds, positive=sens > 0)
            if sigma > 0:
                checks.finite(f"rho(n={n})", lambda: 0.5 * (tail / sigma) ** 2, *eps, *bounds)
            if sigma > 0 and tail > 0:  # the discrete release (release.py): sigma'/g from sigma/tail, int64 draws
                release_checks(checks, sigma / tail, eng.dim, *eps, *bounds)
            release = checks.squared(f"release_norm(n={n})", noise_norm_bound(theta, sigma, eng.dim), *eps, *bounds)
            checks.finite(f"release_score(n={n})", eng.loss.feature_bound * release, *eps, *bounds)

    def _conversion(self) -> str:
        moment = "second" if self.variant == "descend" else "first"
        return (f"relaxed Gaussian mechanism ({moment}-moment Markov tail delta/2 + {self.calibration} Gaussian "
                f"mechanism at delta/2), Mu & Klabjan Lemma {'13' if moment == 'second' else '14'}")

    # ---- calibration --------------------------------------------------------------------------------------
    def capacity_for(self, n: int) -> int:
        cap = min(self.m_max, n - 1)
        if self.variant == "descend":  # Theorem 4 needs m/n < 1/(6B + 1)
            cap = min(cap, math.ceil(n / (6.0 * self.B + 1.0)) - 1)
        return max(cap, 0)

    def sensitivity_bound(self, n: int, m: int, K: int | None = None) -> float:
        """Sigma for a training set of n records and m deletions (public quantities only)."""
        K = self.K if K is None else K
        if self.variant == "descend":
            return d2d_sigma(self.T, K, self.eta, self.mu, self.Ls, self.B, self.C, self.ell0)
        if self.projected:
            return psgd_r2d_sigma(self.regime, self.T, K, n, m, self.eta, self.Ls, self.G, self.mu)
        return sgd_r2d_sigma(self.regime, self.T, K, n, m, self.eta, self.Ls, self.B, self.C, self.ell0, self.mu)

    def min_K(self, n: int, m: int, sigma_target: float) -> int:
        """Smallest K in [0, T] whose release noise is <= sigma_target (R2D; K = T is retraining, sigma 0).

        Uses public quantities only (n, m, T, eta, b, bounds), so the rewind point is data independent."""
        if m == 0:
            return 0
        lo, hi = 0, self.T  # sigma(K) is nonincreasing in K and sigma(T) = 0
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                ok = self.noise_scale(self.sensitivity_bound(n, m, mid))[0] <= sigma_target
            except SpecError:
                ok = False
            lo, hi = (lo, mid) if ok else (mid + 1, hi)
        return lo

    @property
    def tail_sensitivity(self) -> float:
        """The sensitivity the Gaussian release is calibrated on: Sigma / d1 (Sigma / sqrt(d1) for descend)."""
        d1 = 0.5 * self.spec.delta
        return self.sensitivity / (math.sqrt(d1) if self.variant == "descend" else d1)

    def noise_scale(self, sensitivity: float) -> tuple[float, float]:
        """(sigma, tail sensitivity) for the relaxed Gaussian mechanism at (epsilon, spec.delta)."""
        d1 = d2 = 0.5 * self.spec.delta
        tail = sensitivity / (math.sqrt(d1) if self.variant == "descend" else d1)
        if not math.isfinite(tail):
            raise SpecError("the sensitivity bound is vacuous (overflow); lower eta*L*T or raise K")
        return gaussian_sigma(tail, self.spec.epsilon, d2, self.calibration), tail
