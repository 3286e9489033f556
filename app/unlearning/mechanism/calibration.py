"""Creation-time numeric guard: every calibration a model can ever need must be a finite float.

A family's ``check_calibration(spec)`` evaluates, once, the quantities its certificates and updates compute at
their worst case -- the loss constants L, beta, mu from the declared bounds (losses.py), the largest step size
of the schedule, the sigma of the last deletion the ledger can certify, iteration counts, the squared norms the
updates and projections form -- and hands them to a ``Checks`` object, which refuses the spec (``SpecError``)
as soon as one is non-finite, or zero where the family divides by it.  No thresholds are tabulated: the numbers
checked are the ones the engine itself computes, evaluated where they are largest (or smallest).

Worst cases that are not bounded by the spec are fixed here, once:

* ``N_MAX = 2**53``: the largest deletion index, step count and data-set size considered.  Certificates carry
  such counters as float64 (``series_index``, ``n_epoch``), which are exact integers only up to 2**53.
* ``NOISE_TAIL = 40``: a standard Gaussian vector xi in R^p has ||xi|| <= sqrt(p) + 40 except with probability
  exp(-40^2/2) < 1e-347 (Gaussian concentration of the norm, a 1-Lipschitz function); noise steps are checked
  to keep ||theta + sigma xi||^2 finite up to that norm.

The projection in domain.py forms x . x, which overflows long before x itself does, so each update's largest
possible pre-projection norm (``update_norm_bound``, ``noise_norm_bound``) is checked *squared*.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ..contract.errors import CapacityExhausted, SpecError
from .release import GRID_FACTOR

N_MAX = 2**53
NOISE_TAIL = 40.0


class CalibrationError(SpecError):
    """A calibration quantity of the model would be non-finite (or zero where the family divides by it)."""

    def __init__(self, message: str, *, quantity: str, fields: tuple[str, ...] = ()):
        super().__init__(message, fields=fields)
        self.quantity = quantity


class Checks:
    """Collects named worst-case quantities and refuses the first one that is not usable.

    ``fields`` names the spec fields (API paths such as ``bounds.x_norm``) a quantity depends on, most likely
    culprit first; the service uses them to say which field to change and to what range.
    """

    def __init__(self, algorithm: str):
        self.algorithm = algorithm
        self.values: dict[str, float] = {}

    def _fail(self, name: str, value: float, why: str, fields: Iterable[str]) -> None:
        raise CalibrationError(f"{self.algorithm}: {name} would be {why} ({value!r}); the model could not "
                               "compute every certificate it may need", quantity=name, fields=tuple(fields))

    def finite(self, name: str, value: float | Callable[[], float], *fields: str, positive: bool = False) -> float:
        """``value`` (or what computing it gives) must be finite; and > 0 with ``positive`` (it divides)."""
        if callable(value):
            value = self.call(name, value, *fields)
        try:
            v = float(value)
        except (OverflowError, TypeError, ValueError):  # an int beyond float range
            self._fail(name, value, "out of the float range", fields)
        if not math.isfinite(v):
            self._fail(name, v, "non-finite", fields)
        if positive and not v > 0.0:
            self._fail(name, v, "zero (it divides)", fields)
        self.values[name] = v
        return v

    def call(self, name: str, fn: Callable[[], object], *fields: str) -> object:
        """Run ``fn`` (a calibration step of the engine); an arithmetic failure refuses the spec."""
        try:
            return fn()
        except SpecError as e:
            if e.fields:
                raise
            raise CalibrationError(f"{self.algorithm}: {name}: {e}", quantity=name, fields=fields) from None
        except (ArithmeticError, ValueError) as e:
            raise CalibrationError(f"{self.algorithm}: computing {name} fails ({type(e).__name__}: {e})",
                                   quantity=name, fields=fields) from None

    def squared(self, name: str, value: float, *fields: str, positive: bool = False) -> float:
        """``value`` and ``value ** 2`` must be finite: the quantity is squared somewhere (a norm, a charge);
        with ``positive`` both must be > 0 (the square divides, as sigma^2 in rho = Delta^2 / (2 sigma^2))."""
        v = self.finite(name, value, *fields, positive=positive)
        self.finite(name + "^2", v * v, *fields, positive=positive)
        return v


# sigma'/g of a discrete release (release.py) at most 2^56: a draw k then stays below 64 sigma'/g = 2^62 < 2^63 in
# magnitude except with probability < exp(-2000) (CKS20 Prop. 25 tail), so the exact sampler's int64 never overflows.
SIGMA_GRID_MAX = 2.0**56


def release_ratio_bound(multiplier: float, n: int) -> float:
    """(2K + 1) sqrt(n) sigma/Delta: an upper bound on sigma'/g of the discrete release (see release_checks)."""
    return multiplier * (2.0 * GRID_FACTOR + 1.0) * math.sqrt(n)


def require_release_feasible(multiplier: float, n: int, i: int) -> None:
    """Runtime refusal for the unbounded omega series (creation checks deletion 1 only): deletion i, whose noise
    multiplier grows like i^(omega/2), is refused as capacity exhausted (a certified 409, before anything changes)
    once its discrete release could draw beyond int64.  A public function of the spec and i.  (Imports at module
    level: on the forget path, function-level imports cost ~1 us each.)"""
    if not release_ratio_bound(multiplier, n) <= SIGMA_GRID_MAX:
        raise CapacityExhausted(
            f"deletion {i} would need a discrete Gaussian noise scale beyond the exact sampler's 64-bit range "
            f"(sigma'/g > 2^56): the model's omega series can certify no more deletions; an exact retrain is required")


def release_checks(checks: Checks, multiplier: float, n: int, *fields: str) -> float:
    """The discrete release (release.discrete_release) with noise multiplier sigma/Delta on n coordinates: its
    grid is g >= Delta/(2 K sqrt(n)) (or the coarser ulp floor), Delta' = Delta + g sqrt(n) and
    sigma' = sigma Delta'/Delta, so sigma'/g = (sigma/Delta)(Delta/g + sqrt(n)) <= (2K + 1) sqrt(n) sigma/Delta
    whatever Delta and the domain radius: that bound must stay <= SIGMA_GRID_MAX (int64 draws, see above)."""
    r = checks.finite("sigma'/g", lambda: release_ratio_bound(multiplier, n), *fields, positive=True)
    if not r <= SIGMA_GRID_MAX:
        checks._fail("sigma'/g", r, "above 2^56 (a discrete Gaussian draw could overflow int64)", fields)
    return r


def update_norm_bound(radius: float, step: float) -> float:
    """Largest ||theta - eta g|| before the projection: ||theta|| <= R plus the step's length (checked squared)."""
    return radius + step


def noise_norm_bound(radius: float, sigma: float, p: int) -> float:
    """Largest ||theta + sigma xi|| for ||theta|| <= R and ||xi|| <= sqrt(p) + NOISE_TAIL (see module docstring)."""
    return radius + sigma * (math.sqrt(p) + NOISE_TAIL)


def common_checks(checks: Checks, loss, spec) -> None:
    """Loss constants of losses.py (000 §2.0) and the products every OGD-type update forms.

    ||x~||^2 <= X~^2 (projection and adaptive p), |score| <= X~ R (predictions), L^2 (gradient norms squared,
    rho = a^2 / (2 sigma^2)), beta and mu (step sizes 2/(beta + mu), 1/(mu t)).
    """
    X = checks.squared("feature_bound", lambda: loss.feature_bound, "bounds.x_norm")
    checks.finite("D", 2.0 * spec.domain_radius, "domain_radius")
    checks.squared("score_bound", X * spec.domain_radius, "bounds.x_norm", "domain_radius")
    checks.squared("L", lambda: loss.lipschitz, "bounds.x_norm", "domain_radius", "bounds.y_abs", "l2")
    checks.finite("beta", lambda: loss.smoothness, "bounds.x_norm", "l2", positive=True)
    checks.finite("mu", loss.mu, "l2")


ALL_FIELDS = ("bounds.x_norm", "domain_radius", "l2", "bounds.y_abs", "privacy.epsilon", "privacy.delta")


def construct(cls, spec):
    """The engine for ``spec``; an arithmetic failure while deriving its constants becomes a CalibrationError."""
    try:
        return cls(spec)
    except SpecError:
        raise
    except (ArithmeticError, ValueError) as e:
        raise CalibrationError(f"{cls.algorithm}: the constants cannot be derived ({type(e).__name__}: {e})",
                               quantity="constants", fields=ALL_FIELDS) from None


def require_finite_array(values, what: str) -> None:
    """Runtime guard: refuse to publish or store a non-finite number."""
    import numpy as np

    from ..contract.errors import NumericError

    if not np.all(np.isfinite(np.asarray(values, dtype=np.float64))):
        raise NumericError(f"{what} would not be finite")
