"""Conversions zCDP <-> (epsilon, delta): golden values, safe-side rounding, independent cross-checks."""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import norm

from app.privacy import (
    compose,
    delta_from_rho,
    epsilon_from_rho,
    rho_from_epsilon_delta,
    rho_from_pure_dp,
    rho_from_rdp_gaussian,
    sigma_for_rho,
)
from app.privacy.conversions import add_up

# ----------------------------------------------------------------------------------------------------------
# strategies: the ranges the service must handle (rho 1e-12..1e3, delta 1e-15..0.5)
# ----------------------------------------------------------------------------------------------------------
rhos = st.floats(-12.0, 3.0).map(lambda x: 10.0 ** x)
deltas = st.floats(-15.0, math.log10(0.5)).map(lambda x: 10.0 ** x)
epsilons = st.floats(-6.0, 3.0).map(lambda x: 10.0 ** x)


# ----------------------------------------------------------------------------------------------------------
# Golden values (peers-and-conventions.md §3.3 OpenDP test file, §3.4 CKS reference code; 000 digest §6)
# ----------------------------------------------------------------------------------------------------------
def test_golden_opendp_gaussian_scale_4():
    # OpenDP make_gaussian(scale=4), d_in=1 -> rho = 1/(2*16) = 0.03125; make_zCDP_to_approxDP profile
    rho = rho_from_rdp_gaussian(1.0, 4.0)
    assert rho == pytest.approx(0.03125, rel=1e-15)
    assert epsilon_from_rho(0.03125, 1e-3) == pytest.approx(0.6880024554878085, abs=1e-9)
    assert delta_from_rho(0.03125, 0.0) == pytest.approx(0.1508457845622862, abs=1e-12)


@pytest.mark.parametrize("rho, delta, eps_cks, eps_classic", [
    (0.03125, 1e-3, 0.6880025, 0.9605),
    (0.1, 1e-5, 1.91424, 2.2460),
    (1.0, 1e-5, 7.07720, 7.7861),
])
def test_golden_cks_and_classic_table(rho, delta, eps_cks, eps_classic):
    # peers-and-conventions.md §3.4 table (CKS exact column; classic column)
    assert epsilon_from_rho(rho, delta) == pytest.approx(eps_cks, abs=6e-6)
    assert epsilon_from_rho(rho, delta, "classic") == pytest.approx(eps_classic, abs=6e-5)


def test_golden_rho_0025():
    # §3.4: rho = 0.025: epsilon = 1 gives delta = 1.336e-6; delta = 1e-6 gives epsilon = 1.01407
    assert delta_from_rho(0.025, 1.0) == pytest.approx(1.336e-6, rel=5e-4)
    assert epsilon_from_rho(0.025, 1e-6) == pytest.approx(1.01407, abs=6e-6)


def test_golden_classic_inverse_olu_table():
    # 000 digest §6 worked values: eps_DP = 1, delta = 1e-6 -> eps_alg = 0.01747; 2 -> 0.0676; 4 -> 0.254;
    # (1, 1e-5) -> 0.0208
    assert rho_from_epsilon_delta(1.0, 1e-6, "classic") == pytest.approx(0.01747, abs=6e-6)
    assert rho_from_epsilon_delta(2.0, 1e-6, "classic") == pytest.approx(0.0676, abs=6e-5)
    assert rho_from_epsilon_delta(4.0, 1e-6, "classic") == pytest.approx(0.254, abs=6e-4)
    assert rho_from_epsilon_delta(1.0, 1e-5, "classic") == pytest.approx(0.0208, abs=6e-5)
    # closed form (sqrt(ln 1/d + e) - sqrt(ln 1/d))^2
    L = math.log(1e6)
    assert rho_from_epsilon_delta(1.0, 1e-6, "classic") == pytest.approx((math.sqrt(L + 1) - math.sqrt(L)) ** 2,
                                                                          rel=1e-11)


def test_zero_rho_and_pure_dp():
    assert epsilon_from_rho(0.0, 1e-6) == 0.0
    assert epsilon_from_rho(0.0, 1e-6, "classic") == 0.0
    assert delta_from_rho(0.0, 0.0) == 0.0
    assert rho_from_epsilon_delta(0.0, 1e-6, "classic") == 0.0
    assert rho_from_pure_dp(1.0) == pytest.approx(0.5, rel=1e-15)
    assert rho_from_pure_dp(1.0) >= 0.5
    assert rho_from_pure_dp(0.0) == 0.0


# ----------------------------------------------------------------------------------------------------------
# Orientation: a swapped (epsilon, delta) or a sign error must not pass silently
# ----------------------------------------------------------------------------------------------------------
def test_orientation_and_argument_order():
    # keywords and positions mean the same thing
    assert epsilon_from_rho(rho=0.1, delta=1e-5) == epsilon_from_rho(0.1, 1e-5)
    assert delta_from_rho(rho=0.025, epsilon=1.0) == delta_from_rho(0.025, 1.0)
    assert rho_from_epsilon_delta(epsilon=1.0, delta=1e-6) == rho_from_epsilon_delta(1.0, 1e-6)
    # a swapped call either fails validation (delta must be < 1) ...
    with pytest.raises(ValueError):
        epsilon_from_rho(0.1, 1.91424)
    with pytest.raises(ValueError):
        rho_from_epsilon_delta(1e-6, 1.0)
    # ... or gives a visibly different number
    assert abs(rho_from_epsilon_delta(1e-6, 0.5) - rho_from_epsilon_delta(0.5, 1e-6)) > 1e-3
    # directions: more rho -> more epsilon; more delta -> less epsilon; more epsilon -> less delta
    assert epsilon_from_rho(0.2, 1e-5) > epsilon_from_rho(0.1, 1e-5)
    assert epsilon_from_rho(0.1, 1e-3) < epsilon_from_rho(0.1, 1e-5)
    assert delta_from_rho(0.1, 2.0) < delta_from_rho(0.1, 1.0)
    assert rho_from_epsilon_delta(2.0, 1e-6) > rho_from_epsilon_delta(1.0, 1e-6)
    assert rho_from_epsilon_delta(1.0, 1e-3) > rho_from_epsilon_delta(1.0, 1e-6)


@pytest.mark.parametrize("bad", [
    lambda: epsilon_from_rho(-1e-9, 1e-6),
    lambda: epsilon_from_rho(float("nan"), 1e-6),
    lambda: epsilon_from_rho(0.1, 0.0),
    lambda: epsilon_from_rho(0.1, 1.0),
    lambda: epsilon_from_rho(0.1, 1e-6, "cks"),
    lambda: delta_from_rho(0.1, -0.5),
    lambda: rho_from_epsilon_delta(-1.0, 1e-6),
    lambda: rho_from_rdp_gaussian(1.0, 0.0),
    lambda: sigma_for_rho(1.0, 0.0),
    lambda: compose([0.1, -0.01]),
])
def test_invalid_input_rejected(bad):
    with pytest.raises(ValueError):
        bad()


# ----------------------------------------------------------------------------------------------------------
# High-precision reference for "never on the unsafe side" (Decimal, 50 digits, stdlib only).
# log delta_t = t(1+t) rho - t eps - t ln(1 + 1/t) - ln(1+t)  (CKS20 Prop. 12 with alpha = 1 + t) is convex
# in t; its derivative (1+2t) rho - eps - ln(1 + 1/t) is increasing, so a bisection finds the exact infimum.
# ----------------------------------------------------------------------------------------------------------
def _true_log_delta(rho: float, eps: float) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 50
        r, e = Decimal(rho), Decimal(eps)
        one = Decimal(1)

        def g(t: Decimal) -> Decimal:
            return (one + 2 * t) * r - e - (one + one / t).ln()

        lo = min(Decimal("0.5"), (e - 3 * r - one).exp())   # for t <= 1: g(t) <= 3 rho - eps + ln t
        hi = (e + one) / (2 * r) + one
        assert g(lo) < 0 < g(hi)
        for _ in range(200):          # geometric then effectively arithmetic bisection
            mid = (lo * hi).sqrt()
            if g(mid) < 0:
                lo = mid
            else:
                hi = mid
        t = (lo + hi) / 2
        val = t * (one + t) * r - t * e - t * (one + one / t).ln() - (one + t).ln()
        return min(val, Decimal(0))


def _certifies(rho: float, eps: float, delta: float) -> bool:
    """Exact CKS20: does rho-zCDP imply (eps, delta)-DP?"""
    return _true_log_delta(rho, eps) <= Decimal(delta).ln()


@settings(max_examples=30)
@given(rhos, deltas)
@example(1e-12, 1e-15)
@example(1e3, 1e-15)
@example(1e3, 0.5)
@example(0.03125, 1e-3)
def test_epsilon_never_below_exact_and_tight(rho, delta):
    eps = epsilon_from_rho(rho, delta)
    assert eps >= 0.0
    assert _certifies(rho, eps, delta)                       # eps is a true statement (not below the bound)
    if eps > 0.0:
        assert not _certifies(rho, eps * (1 - 1e-10), delta)  # and not needlessly loose


@settings(max_examples=30)
@given(rhos, epsilons)
@example(0.03125, 0.0)
@example(1e3, 0.0)
@example(1e-12, 1e-6)
def test_delta_never_below_exact_and_tight(rho, eps):
    d = delta_from_rho(rho, eps)
    true = float(_true_log_delta(rho, eps).exp())
    assert d >= true
    assert d <= max(true * (1 + 1e-10), 1e-300) or d == 1.0


@settings(max_examples=30)
@given(epsilons, deltas)
@example(1.0, 1e-6)
@example(1e-6, 1e-15)
@example(1e3, 0.5)
def test_inverse_rho_never_above_exact_and_tight(eps, delta):
    rho = rho_from_epsilon_delta(eps, delta)
    assert rho > 0.0
    assert _certifies(rho, eps, delta)                            # rho is within the true inverse
    assert not _certifies(rho * (1 + 1e-9), eps, delta)           # and close to it


@settings(max_examples=40)
@given(epsilons, deltas, st.sampled_from(["cks20", "classic"]))
@example(1.0, 1e-6, "classic")
@example(1.0, 1e-6, "cks20")
@example(1e-05, 10.0 ** (-0.99999), "cks20")   # found by hypothesis: flat log delta(eps) at small eps
def test_inverse_round_trip(eps, delta, conversion):
    rho = rho_from_epsilon_delta(eps, delta, conversion)
    back = epsilon_from_rho(rho, delta, conversion)
    assert back <= eps
    assert back >= eps * (1 - 1e-6)


# ----------------------------------------------------------------------------------------------------------
# Structural properties
# ----------------------------------------------------------------------------------------------------------
@settings(max_examples=40)
@given(rhos, deltas, st.floats(1e-6, 1.0), st.sampled_from(["cks20", "classic"]))
def test_epsilon_monotone_in_rho(rho, delta, bump, conversion):
    assert epsilon_from_rho(rho * (1 + bump), delta, conversion) >= epsilon_from_rho(rho, delta, conversion)


@settings(max_examples=40)
@given(rhos, deltas, st.floats(1e-6, 0.999), st.sampled_from(["cks20", "classic"]))
def test_epsilon_monotone_decreasing_in_delta(rho, delta, shrink, conversion):
    assert epsilon_from_rho(rho, delta * (1 - shrink), conversion) >= epsilon_from_rho(rho, delta, conversion)


@settings(max_examples=40)
@given(rhos, deltas)
def test_cks_never_looser_than_classic(rho, delta):
    cks, classic = epsilon_from_rho(rho, delta), epsilon_from_rho(rho, delta, "classic")
    assert cks <= classic
    # and the classic rho inverse is never larger than the CKS one
    eps = classic
    assert rho_from_epsilon_delta(eps, delta, "classic") <= rho_from_epsilon_delta(eps, delta)


@settings(max_examples=40)
@given(rhos, deltas)
def test_delta_inverts_epsilon(rho, delta):
    eps = epsilon_from_rho(rho, delta)
    assert delta_from_rho(rho, eps) <= delta * (1 + 1e-12)
    if eps > 0:
        assert delta_from_rho(rho, eps * (1 - 1e-6)) > delta


# ----------------------------------------------------------------------------------------------------------
# Independent checks
# ----------------------------------------------------------------------------------------------------------
# dp_accounting rdp_privacy_accountant.DEFAULT_RDP_ORDERS (peers-and-conventions.md §3.1)
DP_ACCOUNTING_ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024],
                                dtype=float)


def _grid_epsilon(rho: float, delta: float, t: np.ndarray) -> float:
    """dp_accounting compute_epsilon 'improved bound' on RDP curve alpha*rho (ZCDpEvent):
    eps = min_alpha  alpha rho + log1p(-1/alpha) - log(delta alpha)/(alpha - 1), clipped at 0; alpha = 1 + t."""
    alpha = 1.0 + t
    eps = alpha * rho + np.log(t / alpha) - (math.log(delta) + np.log1p(t)) / t
    return max(float(np.min(eps)), 0.0)


def _grid_delta(rho: float, eps: float, t: np.ndarray) -> float:
    """dp_accounting compute_delta: log delta = min_alpha (alpha-1)(alpha rho - eps + log1p(-1/alpha)) - log alpha."""
    alpha = 1.0 + t
    logd = t * (alpha * rho - eps + np.log(t / alpha)) - np.log1p(t)
    return float(min(np.exp(np.min(logd)), 1.0))


DENSE_T = np.logspace(-8, 13, 200_001)


@settings(max_examples=40)
@given(rhos, deltas)
@example(0.03125, 1e-3)
def test_epsilon_matches_dense_rdp_grid(rho, delta):
    ours = epsilon_from_rho(rho, delta)
    grid = _grid_epsilon(rho, delta, DENSE_T)
    assert ours <= grid * (1 + 1e-9) + 1e-15          # a grid can only be worse than the exact minimum
    assert ours == pytest.approx(grid, rel=1e-3, abs=1e-12)


@settings(max_examples=40)
@given(rhos, deltas)
def test_epsilon_never_above_dp_accounting_default_orders(rho, delta):
    # the exact optimum can only beat dp_accounting's fixed order grid
    assert epsilon_from_rho(rho, delta) <= _grid_epsilon(rho, delta, DP_ACCOUNTING_ORDERS - 1.0)


@pytest.mark.parametrize("rho, delta, grid_eps", [(0.03125, 1e-3, 0.6881078), (0.1, 1e-5, 1.91425),
                                                  (1.0, 1e-5, 7.07739)])
def test_dp_accounting_default_orders_table(rho, delta, grid_eps):
    # peers-and-conventions.md §3.4 "dp_accounting / Opacus grid" column, and agreement within 1e-3
    grid = _grid_epsilon(rho, delta, DP_ACCOUNTING_ORDERS - 1.0)
    assert grid == pytest.approx(grid_eps, abs=6e-6)
    assert epsilon_from_rho(rho, delta) == pytest.approx(grid, rel=1e-3)


@settings(max_examples=40)
@given(rhos, st.floats(0.0, 50.0))
@example(0.03125, 0.0)
@example(0.025, 1.0)
def test_delta_matches_dense_rdp_grid(rho, eps):
    ours = delta_from_rho(rho, eps)
    grid = _grid_delta(rho, eps, DENSE_T)
    assert ours <= grid * (1 + 1e-9) + 1e-300
    if grid > 1e-280:
        assert ours == pytest.approx(grid, rel=1e-3)


def _gaussian_delta_exact(mu: float, eps: float) -> float:
    """Exact (eps, delta) curve of N(0,1) vs N(mu,1) (Balle & Wang 2018, Thm 8)."""
    return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))


def _gaussian_delta_quad(mu: float, eps: float) -> float:
    """The same by numerical integration: delta = int max(0, p(x) - e^eps q(x)) dx, p = N(mu,1), q = N(0,1).
    p > e^eps q iff x > eps/mu + mu/2."""
    x0 = eps / mu + mu / 2
    val, _ = integrate.quad(lambda x: norm.pdf(x, loc=mu) - math.exp(eps) * norm.pdf(x), x0, np.inf,
                            epsabs=1e-14, epsrel=1e-10)
    return val


@pytest.mark.parametrize("rho, eps", [(0.03125, 0.0), (0.03125, 0.5), (0.025, 1.0), (0.1, 1.0), (1.0, 3.0),
                                      (1.0, 7.0), (5.0, 10.0)])
def test_cks_bound_dominates_exact_gaussian(rho, eps):
    # A Gaussian mechanism with Delta/sigma = sqrt(2 rho) is rho-zCDP, so the conversion must cover it.
    mu = math.sqrt(2 * rho)
    exact = _gaussian_delta_exact(mu, eps)
    assert _gaussian_delta_quad(mu, eps) == pytest.approx(exact, rel=1e-6, abs=1e-13)
    cks, classic = delta_from_rho(rho, eps), delta_from_rho(rho, eps, "classic")
    assert exact <= cks <= classic
    assert cks <= 10 * exact      # tight enough to be useful for the Gaussian (the zCDP-extremal mechanism)


# ----------------------------------------------------------------------------------------------------------
# Mechanism helpers and composition
# ----------------------------------------------------------------------------------------------------------
@settings(max_examples=60)
@given(st.floats(1e-6, 1e3), rhos)
def test_sigma_for_rho_round_trip_is_conservative(sensitivity, rho):
    sigma = sigma_for_rho(sensitivity, rho)
    assert sigma >= sensitivity / math.sqrt(2 * rho)
    assert rho_from_rdp_gaussian(sensitivity, sigma) <= rho
    assert rho_from_rdp_gaussian(sensitivity, sigma) == pytest.approx(rho, rel=1e-12)


@settings(max_examples=60)
@given(st.lists(st.floats(0.0, 10.0), max_size=50))
@example([2.225073858507e-311])
@example([0.1, 0.2])
def test_compose_is_sum_rounded_up(parts):
    total = compose(parts)
    from fractions import Fraction
    exact = sum((Fraction(p) for p in parts), Fraction(0))
    assert Fraction(total) >= exact                                   # never below the exact sum
    assert total <= math.nextafter(math.fsum(parts), math.inf)        # and at most one ulp above it
    if Fraction(math.fsum(parts)) == exact:
        assert total == math.fsum(parts)                              # exact sums are not inflated


@settings(max_examples=60)
@given(st.floats(0.0, 1e6), st.floats(0.0, 1e6))
def test_add_up_never_below_exact(a, b):
    from fractions import Fraction
    s = add_up(a, b)
    assert Fraction(s) >= Fraction(a) + Fraction(b)
    assert s <= math.nextafter(a + b, math.inf)


@pytest.mark.parametrize("rho", [1e-300, 1e-20, 1e6, 1e9])
@pytest.mark.parametrize("delta", [1e-300, 1e-15, 0.9])
def test_far_outside_supported_range_still_terminates_and_is_sound(rho, delta):
    # regression: a linear-space root bracket of 1e-300..1e300 used to stall (and a nudge loop to hang)
    eps = epsilon_from_rho(rho, delta)
    assert 0.0 <= eps <= epsilon_from_rho(rho, delta, "classic")
    assert delta_from_rho(rho, eps) <= delta * (1 + 1e-9)
    if eps > 0:
        r = rho_from_epsilon_delta(eps, delta)
        assert r <= rho * (1 + 1e-9) and epsilon_from_rho(r, delta) <= eps


@settings(max_examples=60)
@given(st.floats(1e-6, 1e3), st.floats(1e-3, 1e3), st.floats(0.0, 100.0))
@example(1.0, 3.0, 0.1)
def test_mechanism_charges_never_below_exact(sensitivity, sigma, eps):
    from fractions import Fraction
    exact = Fraction(sensitivity) ** 2 / (2 * Fraction(sigma) ** 2)
    got = rho_from_rdp_gaussian(sensitivity, sigma)
    assert Fraction(got) >= exact and got == pytest.approx(float(exact), rel=1e-14)
    got = rho_from_pure_dp(eps)
    assert Fraction(got) >= Fraction(eps) ** 2 / 2 and got == pytest.approx(eps * eps / 2, rel=1e-14)
