"""zCDP <-> (epsilon, delta) conversions, with conservative (safe-side) rounding.

The ledger stores privacy loss in zero-concentrated DP units: rho-zCDP means the Renyi divergence of every
order alpha > 1 is at most alpha * rho (Bun & Steinke 2016, Def. 1.1).  Sequential composition adds rho.
For reporting, rho is converted to an (epsilon, delta) statement.

Two conversions are offered:

* ``"cks20"`` -- Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020,
  arXiv:2004.00010), Prop. 12 / Cor. 13: rho-zCDP implies (epsilon, delta)-DP with

      delta = inf_{alpha > 1}  exp((alpha-1)(alpha*rho - epsilon)) / (alpha - 1) * (1 - 1/alpha)^alpha.

  Any alpha > 1 gives a *valid* delta, so an imperfect minimisation only makes delta larger (still true).
  The same bound is dp_accounting's ``compute_epsilon`` "improved bound" and Opacus' Balle et al. 2020
  Thm. 21 (peers-and-conventions.md §3.1-3.2).  Reimplemented here (not copied from ``cdp2adp.py``):
  we minimise over t = alpha - 1 > 0, which is numerically stable for alpha near 1 and for alpha ~ 1e12.

* ``"classic"`` -- Bun & Steinke 2016, Prop. 1.3: epsilon = rho + 2 sqrt(rho ln(1/delta)), i.e.
  delta = exp(-(epsilon - rho)^2 / (4 rho)) for epsilon >= rho.  This is the rule the papers (000/001 §6,
  descent-to-delete Lemma A.3, memory pair odometer) print; it is 10-40% looser than CKS20.

Rounding policy (every function, both conversions):

* epsilon and delta are never returned *below* the exact bound of the named conversion;
* the inverse rho (a budget) is never returned *above* the exact value;
* rho charges (``rho_from_*``, ``compose``) are never returned below the exact value.

We achieve this by evaluating log(delta) with an explicit floating-point error allowance (``_slack``) and
bisecting so that the kept endpoint always satisfies the inequality with that allowance.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable

from scipy.optimize import brentq, minimize_scalar

__all__ = [
    "CONVERSIONS",
    "epsilon_from_rho",
    "delta_from_rho",
    "rho_from_epsilon_delta",
    "rho_from_rdp_gaussian",
    "rho_from_pure_dp",
    "sigma_for_rho",
    "compose",
    "add_up",
]

CONVERSIONS = ("cks20", "classic")

_U = 2.0 ** -52          # machine epsilon of float64 (one ulp at 1.0)
_T_MIN = 1e-300           # smallest alpha - 1 we evaluate (1/t must stay finite)
_T_MAX = 1e300
# The inverse aims at epsilon * (1 - _INV_MARGIN) so that the forward conversion of the returned rho, with
# its own bisection tolerance (_BISECT_RTOL), can never come out above the requested epsilon.
_BISECT_RTOL = 1e-14
_INV_MARGIN = 1e-12


# ----------------------------------------------------------------------------------------------------------
# small directed-rounding helpers
# ----------------------------------------------------------------------------------------------------------
def _up(x: float, ulps: int = 1) -> float:
    for _ in range(ulps):
        x = math.nextafter(x, math.inf)
    return x


def _down(x: float, ulps: int = 1) -> float:
    for _ in range(ulps):
        x = math.nextafter(x, -math.inf)
    return max(x, 0.0)


def add_up(a: float, b: float) -> float:
    """a + b rounded towards +inf (never below the exact sum).  TwoSum (Knuth) gives the rounding error."""
    s = a + b
    if math.isinf(s):
        return s
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return math.nextafter(s, math.inf) if err > 0 else s


def compose(rhos: Iterable[float]) -> float:
    """Sequential composition of zCDP mechanisms: rho_total = sum rho_i (Bun & Steinke 2016, Lemma 2.3).

    ``math.fsum`` is correctly rounded; the fsum of the residual gives the sign of the rounding error exactly,
    and one ulp up when it was rounded down makes the result never below the exact sum.
    Composition only applies within one ledger *epoch*: an exact retrain on the retained data yields a state
    that depends on no forgotten record, so a new epoch starts from rho = 0 (see ledger.py).
    """
    vals = [float(r) for r in rhos]
    for r in vals:
        if not (r >= 0.0):
            raise ValueError(f"rho must be >= 0, got {r!r}")
    total = math.fsum(vals)
    if math.isinf(total):
        return total
    return _up(total) if math.fsum(vals + [-total]) > 0.0 else total


# ----------------------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------------------
def _check_rho(rho: float) -> float:
    rho = float(rho)
    if math.isnan(rho) or rho < 0.0:
        raise ValueError(f"rho must be >= 0, got {rho!r}")
    return rho


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return delta


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if math.isnan(eps) or eps < 0.0:
        raise ValueError(f"epsilon must be >= 0, got {eps!r}")
    return eps


def _check_conversion(conversion: str) -> str:
    if conversion not in CONVERSIONS:
        raise ValueError(f"unknown conversion {conversion!r}; expected one of {CONVERSIONS}")
    return conversion


# ----------------------------------------------------------------------------------------------------------
# CKS20 core
# ----------------------------------------------------------------------------------------------------------
# With t = alpha - 1 > 0 the log of the CKS20 Prop. 12 expression is
#     log delta_t = t(alpha rho - eps) + alpha log(1 - 1/alpha) - log t
#                 = t(1+t)rho - t eps - t log1p(1/t) - log1p(t)            [log t - log1p t = -log1p(1/t)]
# and its derivative in t (equal to the derivative in alpha; CKS20 p.13 / cdp2adp.cdp_delta) is
#     g(t) = (1 + 2t) rho - eps - log1p(1/t),
# strictly increasing in t (g' = 2 rho + 1/(t(1+t)) > 0): log delta_t is convex in t with one minimiser.
def _log_delta_t(rho: float, eps: float, t: float) -> tuple[float, float]:
    """(log delta_t, absolute floating-point error allowance of that value)."""
    a = t * ((1.0 + t) * rho)
    b = t * eps
    c = t * math.log1p(1.0 / t)
    d = math.log1p(t)
    val = a - b - c - d
    if not math.isfinite(val):      # overflow far outside the supported range: fall back to the trivial
        return 0.0, 0.0             # bound delta <= 1 (always true, never optimistic)
    # each term carries a few roundings (<= 4 ulps each, generous); the sum adds one per operation
    slack = 16.0 * _U * (abs(a) + abs(b) + abs(c) + abs(d) + abs(val)) + 1e-300
    return val, slack


def _g(t: float, rho: float, eps: float) -> float:
    return (1.0 + 2.0 * t) * rho - eps - math.log1p(1.0 / t)


def _optimal_t(rho: float, eps: float) -> float:
    """The minimiser t* = alpha* - 1 of log delta_t (approximately; any t > 0 gives a valid bound)."""
    # upper bracket as in CKS20's code (alpha_max = (eps+1)/(2 rho) + 2): g(t_hi) >= rho + 1 - log 2 > 0
    t_hi = min((eps + 1.0) / (2.0 * rho) + 1.0, _T_MAX)
    if _g(t_hi, rho, eps) <= 0.0:          # only when rho is so small that t_hi was clamped
        return t_hi
    # lower bracket: for t <= 1, g(t) <= 3 rho - eps + log t < 0 once log t < eps - 3 rho
    t_lo = min(0.5, math.exp(min(eps - 3.0 * rho - 1.0, 0.0)))
    t_lo = max(t_lo, _T_MIN)
    if _g(t_lo, rho, eps) >= 0.0:          # minimiser below the representable range: delta_t ~ 1 anyway
        return t_lo
    # Solve in s = log t: the bracket can span 1e-300 .. 1e300, which a linear-space Brent search cannot
    # resolve in a bounded number of steps.  The minimiser need not be exact (log delta_t is flat there and
    # every t is valid); disp=False returns the current estimate if float noise in g stalls convergence.
    s = brentq(lambda s_: _g(math.exp(s_), rho, eps), math.log(t_lo), math.log(t_hi),
               xtol=1e-13, rtol=1e-13, maxiter=300, disp=False)
    return min(max(math.exp(float(s)), _T_MIN), _T_MAX)


def _cks_log_delta_upper(rho: float, eps: float, slack_factor: float = 1.0) -> float:
    """An upper bound (float-safe) on log of the CKS20 delta(rho, eps); rho > 0.

    ``slack_factor`` > 1 demands extra headroom (used by the inverse, see rho_from_epsilon_delta)."""
    t = _optimal_t(rho, eps)
    val, slack = _log_delta_t(rho, eps, t)
    return min(val + slack_factor * slack, 0.0)


def _classic_log_delta_upper(rho: float, eps: float) -> float:
    """log of Bun-Steinke delta = exp(-(eps - rho)^2 / (4 rho)) for eps >= rho; log 1 = 0 otherwise."""
    if eps <= rho:
        return 0.0
    x = eps - rho
    val = -(x * x) / (4.0 * rho)
    return min(val + 8.0 * _U * abs(val) + 1e-300, 0.0)


def _log_delta_upper(rho: float, eps: float, conversion: str) -> float:
    if conversion == "cks20":
        return _cks_log_delta_upper(rho, eps)
    return _classic_log_delta_upper(rho, eps)


# ----------------------------------------------------------------------------------------------------------
# public conversions
# ----------------------------------------------------------------------------------------------------------
def delta_from_rho(rho: float, epsilon: float, conversion: str = "cks20") -> float:
    """delta such that rho-zCDP implies (epsilon, delta)-DP; never below the exact bound; at most 1."""
    rho, eps, conversion = _check_rho(rho), _check_eps(epsilon), _check_conversion(conversion)
    if rho == 0.0:
        return 0.0
    if math.isinf(rho):
        return 1.0
    if math.isinf(eps):
        return 0.0
    ld = _log_delta_upper(rho, eps, conversion)
    return min(_up(math.exp(ld), 2), 1.0)   # exp is faithful to ~1 ulp: two ulps up is safe


def _classic_epsilon(rho: float, log_inv_delta: float) -> float:
    # Bun & Steinke 2016, Prop. 1.3: eps = rho + 2 sqrt(rho ln(1/delta)); a handful of roundings -> +8 ulps
    return _up(rho + 2.0 * math.sqrt(rho * log_inv_delta), 8)


def _cks_epsilon_direct(rho: float, log_inv_delta: float) -> float | None:
    """CKS20 epsilon as one minimisation over the order: for every alpha = 1 + t > 1,

        eps_t = alpha rho + (alpha log1p(-1/alpha) - log t + log(1/delta)) / t

    is a valid epsilon at delta (solving CKS20's delta_alpha(eps) = delta for eps; the same expression as
    dp_accounting's improved RDP conversion with rdp = alpha rho), and the minimum over t is the CKS20 epsilon.
    Any t is valid, so a bounded Brent search in log t only affects tightness; the caller still checks the
    result with the float-safe delta bound.  None if the search meets float trouble."""
    def eps_t(s_: float) -> float:
        t = math.exp(s_)
        a = 1.0 + t
        return a * rho + (a * math.log1p(-1.0 / a) - s_ + log_inv_delta) / t

    res = minimize_scalar(eps_t, bounds=(math.log(_T_MIN_DIRECT), math.log(_T_MAX_DIRECT)), method="bounded",
                          options={"xatol": 1e-10, "maxiter": 500})
    val = float(res.fun)
    if not (math.isfinite(val) and val >= 0.0):
        return None
    return _up(val, 64)


_T_MIN_DIRECT, _T_MAX_DIRECT = 1e-12, 1e15


@functools.lru_cache(maxsize=4096)  # pure; every receipt and ledger view asks again (3-4 ms a search)
def epsilon_from_rho(rho: float, delta: float, conversion: str = "cks20") -> float:
    """epsilon such that rho-zCDP implies (epsilon, delta)-DP (rho = 0 gives 0).  Never below the exact bound.

    cks20: bisection over epsilon on the CKS20 delta (as ``cdp2adp.cdp_eps``), upper bracket the classic bound;
    the kept endpoint always satisfies delta_upper(rho, eps) <= delta.
    """
    rho, delta, conversion = _check_rho(rho), _check_delta(delta), _check_conversion(conversion)
    if rho == 0.0:
        return 0.0
    if math.isinf(rho):
        return math.inf
    log_inv_delta = -math.log(delta)
    classic = _classic_epsilon(rho, log_inv_delta)
    if conversion == "classic":
        return classic
    log_delta = math.log(delta)

    def ok(e: float) -> bool:   # is (e, delta) certified?
        return _cks_log_delta_upper(rho, e) <= log_delta

    if ok(0.0):
        return 0.0
    direct = _cks_epsilon_direct(rho, log_inv_delta)
    if direct is not None and direct <= classic and ok(direct):
        return direct   # certified by the same float-safe delta check as the bisection's kept endpoint
    lo, hi = 0.0, classic
    if not ok(hi):
        # CKS20 <= classic mathematically, so this only happens through float trouble far outside the supported
        # range; the classic bound (Bun-Steinke Prop. 1.3) is itself valid.
        return classic
    while hi - lo > _BISECT_RTOL * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def rho_from_epsilon_delta(epsilon: float, delta: float, conversion: str = "cks20") -> float:
    """The largest rho whose conversion certifies (epsilon, delta); never above the exact value.

    Used to calibrate a model's zCDP budget from its (epsilon, delta) target.  classic:
    rho = (sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)))^2 (000 §6; D2D Lemma A.3 solved for rho).
    The result satisfies epsilon_from_rho(result, delta, conversion) <= epsilon.
    """
    eps, delta, conversion = _check_eps(epsilon), _check_delta(delta), _check_conversion(conversion)
    if math.isinf(eps):
        return math.inf
    target = eps * (1.0 - _INV_MARGIN)   # leave room for the forward conversion's bisection tolerance
    if conversion == "classic":
        if target == 0.0:
            return 0.0
        L = -math.log(delta)
        # sqrt(L + e) - sqrt(L) = e / (sqrt(L + e) + sqrt(L)), stable for small e
        r = target / (math.sqrt(L + target) + math.sqrt(L))
        return _down(r * r, 8)
    log_delta = math.log(delta)

    # Four error allowances instead of one: the forward conversion re-evaluates log delta at other epsilons
    # (and other minimisers t), each with its own rounding error of up to one allowance.  Without this headroom
    # the forward result can exceed epsilon where log delta is flat in epsilon (small eps, large delta).
    def ok(r: float) -> bool:
        return r == 0.0 or _cks_log_delta_upper(r, target, slack_factor=4.0) <= log_delta

    lo, hi = 0.0, target + 1.0
    while ok(hi):
        lo, hi = hi, 2.0 * hi
        if hi > _T_MAX:
            raise ValueError("rho is unbounded for this (epsilon, delta)")
    while hi - lo > _BISECT_RTOL * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


# ----------------------------------------------------------------------------------------------------------
# mechanism -> rho
# ----------------------------------------------------------------------------------------------------------
def rho_from_rdp_gaussian(sensitivity: float, sigma: float) -> float:
    """Gaussian mechanism with L2 sensitivity Delta and noise N(0, sigma^2 I): rho = Delta^2 / (2 sigma^2).

    Its Renyi divergence is alpha Delta^2/(2 sigma^2) exactly (Mironov 2017 Cor. 3; Bun-Steinke Prop. 1.6).
    Rounded up (a charge is never under-stated).
    """
    sensitivity, sigma = float(sensitivity), float(sigma)
    if not (sensitivity >= 0.0) or math.isinf(sensitivity):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    if not (sigma > 0.0):
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    if sensitivity == 0.0:
        return 0.0
    if math.isinf(sigma):
        return 0.0
    q = sensitivity / sigma
    return _up(q * q / 2.0, 3)


def sigma_for_rho(sensitivity: float, rho: float) -> float:
    """Noise scale for a Gaussian step that costs at most rho: sigma = Delta / sqrt(2 rho), rounded up.

    Rounded so that ``rho_from_rdp_gaussian(sensitivity, sigma_for_rho(sensitivity, rho)) <= rho``.
    """
    sensitivity, rho = float(sensitivity), float(rho)
    if not (sensitivity >= 0.0) or math.isinf(sensitivity):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    if not (rho > 0.0) or math.isinf(rho):
        raise ValueError(f"rho must be finite and > 0, got {rho!r}")
    if sensitivity == 0.0:
        return 0.0
    return _up(sensitivity / math.sqrt(2.0 * rho), 8)


def rho_from_pure_dp(eps: float) -> float:
    """epsilon-DP implies (eps^2 / 2)-zCDP (Bun & Steinke 2016, Prop. 1.4).  Rounded up."""
    eps = _check_eps(eps)
    if eps == 0.0:
        return 0.0
    return _up(eps * eps / 2.0, 2)
