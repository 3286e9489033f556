"""Public constants of descent-to-delete (paper 002), from the spec and n only -- never from the data.

Every formula cites the digest (``reference/descent-to-delete.md``, §3 and §7.4).  Conventions:
``d`` is the parameter dimension (features + bias), ``D`` the diameter 2R of Theta, ``n`` the size at the last
full training (Assumption 2.6: the dataset never shrinks below n/2 between full trainings).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def gauss_c(eps: float, delta: float) -> float:
    """c = sqrt(log(1/delta) + eps) - sqrt(log(1/delta)), in the stable form eps / (sqrt(a+eps) + sqrt(a))."""
    a = math.log(1.0 / delta)
    return eps / (math.sqrt(a + eps) + math.sqrt(a))


def calibrate(sensitivity: float, eps: float, delta: float) -> float:
    """sigma(Delta, eps, delta) = Delta / (sqrt 2 c): Lemma A.3 (Bun-Steinke) solved for sigma (digest §2.3)."""
    return sensitivity / (math.sqrt(2.0) * gauss_c(eps, delta))


def gaussian_epsilon(distance: float, sigma: float, delta: float) -> float:
    """Lemma A.3: N(mu, s^2 I) and N(mu', s^2 I) with ||mu - mu'|| <= distance are (eps, delta)-close for this eps."""
    if distance == 0.0:
        return 0.0
    if sigma <= 0.0:
        return math.inf
    r = distance / sigma
    return r * r / 2.0 + r * math.sqrt(2.0 * math.log(1.0 / delta))


def pow_gamma(log_gamma: float, k: float) -> tuple[float, float]:
    """(gamma^k, 1 - gamma^k), stable for gamma close to 1 (digest pitfall 21)."""
    return math.exp(k * log_gamma), -math.expm1(k * log_gamma)


@dataclass(frozen=True)
class PGDConstants:
    """Step size and contraction of projected GD on an m-strongly convex, M-smooth, L-Lipschitz objective."""

    L: float
    M: float
    m: float

    @property
    def gamma(self) -> float:
        return (self.M - self.m) / (self.M + self.m)  # Thm 2.13

    @property
    def eta(self) -> float:
        return 2.0 / (self.M + self.m)

    @property
    def log_gamma(self) -> float:
        g = self.gamma
        return math.log(g) if g > 0 else -math.inf


def training_iterations(c: PGDConstants, I: int, D: float, n: int, L_T: float | None = None) -> int:
    """T = I + max(0, log(D m n / (2L)) / log(1/gamma)) (Thm 3.1/3.4/3.5; L_T = L of f for 3.4/3.5, E3)."""
    L = c.L if L_T is None else L_T
    extra = math.log(D * c.m * n / (2.0 * L)) / (-c.log_gamma) if c.log_gamma > -math.inf else 0.0
    return I + max(0, math.ceil(extra - 1e-12))


def secret_sensitivity(c: PGDConstants, I: int, n: int) -> float:
    """Delta = 8 L gamma^I / (m n (1 - gamma^I)) (Thm 3.1, 3.4; digest §3.2)."""
    gI, omg = pow_gamma(c.log_gamma, I)
    return 8.0 * c.L * gI / (c.m * n * omg)


def secret_radius(c: PGDConstants, I: int, n: int) -> float:
    """Invariant (eq. 3): ||theta_hat_i - theta*_i|| <= (4L/(mn)) gamma^I / (1 - gamma^I)."""
    return secret_sensitivity(c, I, n) / 2.0


def perfect_min_iterations(c: PGDConstants, d: int, eps: float, delta: float) -> float:
    """I_min = log( sqrt(2d) / ((1-gamma)(sqrt(x+eps) - sqrt(x))) ) / log(1/gamma), x = 2 log(2/delta) (Thm 3.2)."""
    x = 2.0 * math.log(2.0 / delta)
    diff = eps / (math.sqrt(x + eps) + math.sqrt(x))
    return math.log(math.sqrt(2.0 * d) / ((1.0 - c.gamma) * diff)) / (-c.log_gamma)


def perfect_sigma(c: PGDConstants, I: int, n: int, eps: float, delta: float) -> float:
    """sigma = 8 L gamma^I / ((1-gamma^I) m n (sqrt(x+3eps) - sqrt(x+2eps))), x = 2 log(2/delta) (Thm 3.2)."""
    x = 2.0 * math.log(2.0 / delta)
    diff = eps / (math.sqrt(x + 3 * eps) + math.sqrt(x + 2 * eps))
    gI, omg = pow_gamma(c.log_gamma, I)
    return 8.0 * c.L * gI / (omg * c.m * n * diff)


def perfect_sensitivity(c: PGDConstants, I: int, n: int, sigma: float, d: int) -> float:
    """Delta = (gamma^I/(1-gamma^I)) (8L/(mn) + sigma sqrt(2d)): the tight form of the Thm 3.2 proof (E4)."""
    gI, omg = pow_gamma(c.log_gamma, I)
    return gI / omg * (8.0 * c.L / (c.m * n) + sigma * math.sqrt(2.0 * d))


def perfect_radius(c: PGDConstants, I: int, n: int, sigma: float, d: int) -> float:
    """Eq. 13 (w.p. 1 - delta/2): ||mu'_i - theta*_i|| <= (gamma^I/(1-gamma^I)) (4L/(mn) + sigma sqrt(2d))."""
    gI, omg = pow_gamma(c.log_gamma, I)
    return gI / omg * (4.0 * c.L / (c.m * n) + sigma * math.sqrt(2.0 * d))


def perfect_ratio_bound(eps: float, delta: float) -> float:
    """sqrt(x + 2 eps) - sqrt(x), x = 2 log(2/delta): the largest Delta/sigma for which Lemma A.3 at delta/2 gives
    eps (Thm 3.2 splits it as a + b, a = sqrt(x+3eps) - sqrt(x+2eps) for sigma, b = sqrt(x+eps) - sqrt(x) for I_min;
    E4).  Stable form 2 eps / (sqrt(x + 2 eps) + sqrt(x))."""
    x = 2.0 * math.log(2.0 / delta)
    return 2.0 * eps / (math.sqrt(x + 2.0 * eps) + math.sqrt(x))


def perfect_rerounding(c: PGDConstants, I: int, d: int, sigma: float, sigma_released: float, grid: float) -> float:
    """(gamma^I/(1-gamma^I)) (sqrt(2d) (sigma' - sigma) + g sqrt(d)/2): what the discrete releases the perfect
    variant warm-starts from add to the radius of eq. 13 (issue 29 item 7; derivation in descent_to_delete.py):
    each release rounds the mean to the grid g (at most g sqrt(d)/2 in l2) and its noise has the lattice's sigma'
    = sigma (Delta + g sqrt(d))/Delta > sigma; both are carried into the next round and contracted like the noise."""
    gI, omg = pow_gamma(c.log_gamma, I)
    return gI / omg * (math.sqrt(2.0 * d) * (sigma_released - sigma) + grid * math.sqrt(d) / 2.0)


def perfect_update_iterations(c: PGDConstants, I: int, i: int, d: int, delta: float) -> int:
    """T_i = I + log(log(4 d i / delta)) / log(1/gamma) (Thm 3.2), rounded up."""
    return I + max(0, math.ceil(math.log(math.log(4.0 * d * i / delta)) / (-c.log_gamma)))


def strong_regularization(L: float, M: float, D: float, d: int, eps: float, delta: float, n: int, I: int,
                          exponent: float = 0.4) -> float:
    """m = (M^{3/2} L sqrt(d log(1/delta)) / (D eps n I))^{2/5} (Thm 3.4 with the E1 exponent; 4/5 is printed)."""
    X = M**1.5 * L * math.sqrt(d * math.log(1.0 / delta)) / (D * eps * n * I)
    return X**exponent


def weak_regularization(L: float, M: float, D: float, d: int, eps: float, delta: float, n: int, I: int,
                        xi: float = 1.0) -> float:
    """m = (L^2 M^{(1+xi)/xi} d log(1/delta) / (D^2 eps^2 n^2 I^{1/xi}))^{xi/(3xi+1)} (Rem. 3.6; xi = 1 is Thm 3.5)."""
    X = L * L * M ** ((1 + xi) / xi) * d * math.log(1.0 / delta) / (D * D * eps * eps * n * n * I ** (1.0 / xi))
    return X ** (xi / (3 * xi + 1))


def weak_sensitivity(c: PGDConstants, I: int, n: int, xi: float = 1.0) -> float:
    """Delta = 8 L' (M'/(m I))^{1/(2 xi)} / (m n) with M' = M_g - m (App. E, eq. 19; Fact E.1/E.2)."""
    Mp = c.M - c.m
    return 8.0 * c.L * (Mp / (c.m * I)) ** (1.0 / (2.0 * xi)) / (c.m * n)


# an iteration count beyond this is saturated (no request could run it: the work budget refuses it by far)
ITERATIONS_CAP = 2**62


def weak_update_iterations(I: int, i: int, xi: float = 1.0) -> int:
    """T_i = i^{2 xi} I (Thm 3.5, Rem. 3.6), saturated at ITERATIONS_CAP: computed in logarithms first, since the
    float power overflows for a large xi (xi = 76.6 at i = 10^6 was an OverflowError, a 500 at creation)."""
    if i <= 1:
        return math.ceil(I - 1e-9)
    if 2.0 * xi * math.log(i) + math.log(max(I, 1)) >= math.log(ITERATIONS_CAP):
        return ITERATIONS_CAP
    return min(ITERATIONS_CAP, math.ceil(i ** (2.0 * xi) * I - 1e-9))


def weak_radius(c: PGDConstants, I: int, n: int, i: int, xi: float = 1.0) -> float:
    """Eq. 18: ||theta_hat_i - theta*r_i|| <= (4L'/(mn)) i gamma^{i^{2xi} I}."""
    return 4.0 * c.L / (c.m * n) * i * math.exp(weak_update_iterations(I, i, xi) * c.log_gamma)


# ---- perturbed distributed descent (Thm 4.5) ----------------------------------------------------------------
@dataclass(frozen=True)
class DistributedSizes:
    K: int   # partitions
    B: int   # bootstrap size K^2 >= n^xi
    P: int   # partition size B/K = K
    C: int   # independent copies

    @classmethod
    def for_n(cls, n: int, xi: float, beta: float) -> DistributedSizes:
        K = max(1, math.ceil(n ** (xi / 2.0) - 1e-9))  # pitfall 18: K = ceil(n^{xi/2}), B = K^2
        C = max(1, math.ceil(math.log2(2.0 / beta) - 1e-12))
        return cls(K, K * K, K, C)


def distributed_a(sz: DistributedSizes, n: int, I: int) -> float:
    """a = K n^2 I / B^2 (= I n^{(4-3xi)/2})."""
    return sz.K * n * n * I / (sz.B * sz.B)


def distributed_sensitivity(c: PGDConstants, a: float, n: int) -> float:
    """Delta = 8 L gamma^a / (m n (1 - gamma^a)) (Thm 4.5); sigma = calibrate(Delta, eps, delta/2)."""
    ga, omg = pow_gamma(c.log_gamma, a)
    return 8.0 * c.L * ga / (c.m * n * omg)


def distributed_training_iterations(c: PGDConstants, sz: DistributedSizes, a: float, D: float, delta: float) -> int:
    """T >= a + log(D m B (1 + 10 log(2/delta)) / L) / log(1/gamma) (Thm 4.5)."""
    extra = math.log(D * c.m * sz.B * (1.0 + 10.0 * math.log(2.0 / delta)) / c.L) / (-c.log_gamma)
    return math.ceil(a + max(0.0, extra) - 1e-9)


def distributed_budget(c: PGDConstants, sz: DistributedSizes, n: int, I: int, i: int, delta: float) -> float:
    """T_i = 10 log(2i/delta) (I + (B^2/(K n^2)) log(1 + 10 i log(2i/delta)) / log(1/gamma)) (Thm 4.5)."""
    lg = math.log(2.0 * i / delta)
    return 10.0 * lg * (I + sz.B**2 / (sz.K * n * n) * math.log(1.0 + 10.0 * i * lg) / (-c.log_gamma))


def distributed_partition_iterations(c: PGDConstants, sz: DistributedSizes, n: int, I: int, i: int, delta: float,
                                     changed: int) -> int:
    """T' = floor(K n T_i / (B |ind|)), never below a + log(1 + 10 i log(2i/delta))/log(1/gamma) (eq. 21, pitfall 17)."""
    Ti = distributed_budget(c, sz, n, I, i, delta)
    lg = math.log(2.0 * i / delta)
    floor_needed = math.ceil(distributed_a(sz, n, I) + math.log(1.0 + 10.0 * i * lg) / (-c.log_gamma) - 1e-9)
    return max(math.floor(sz.K * n * Ti / (sz.B * changed)), floor_needed)
