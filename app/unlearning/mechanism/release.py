"""The one release mechanism every noising family uses: the discrete Gaussian on a declared grid.

Why.  Continuous floating-point Gaussian noise leaks through the low-order bits of its outputs (Mironov, CCS 2012),
and noise below the float64 resolution of the state vanishes when added (issue 14, cases 1 and 4).  Every family
therefore publishes

    published = g * (round(theta / g) + k),     k_j ~ N_Z(0, (sigma' / g)^2) i.i.d.      (``discrete_release``)

where g is a power of two (so theta / g and g * integer are exact in float64; ``round`` is to nearest, ties to
even, also exact) and N_Z is the discrete Gaussian (Canonne, Kamath, Steinke 2020, "CKS20"), drawn exactly by the
noise source's ``discrete_gaussian``.  A family that projects onto K afterwards (Pi_K) post-processes the lattice
point; so does the float64 multiplication by g when |round(theta/g) + k| >= 2^53.

Privacy, restated.  CKS20 Thm 14 (with Prop. 5 for one coordinate): adding N_Z(0, s^2)^n to an integer vector
whose value can move by at most D in l2 between the two worlds is D^2 / (2 s^2)-zCDP, with no delta term.  If the
secret states of the two worlds differ by at most Delta in l2, the rounded states differ by at most
Delta / g + sqrt(n) in l2 (each coordinate's rounding moves it by at most 1/2, twice).  In parameter units the
lattice sensitivity is therefore Delta' = Delta + g sqrt(n), and the noise is scaled to sigma' = sigma Delta' / Delta,
so the charge Delta'^2 / (2 sigma'^2) = Delta^2 / (2 sigma^2) is the very rho each family certified for the
continuous mechanism (sigma'/g is then rounded up to 29 significant bits for the compiled sampler, which only
lowers the true charge below the certified one): the ledger, the omega series and app/privacy's zCDP -> (epsilon, delta) conversions are
unchanged.  The families calibrated directly to (epsilon, delta) (descent-to-delete, rewind) keep the ratio
sigma'/Delta' = sigma/Delta; their certificates additionally state the zCDP charge Delta^2/(2 sigma^2).

The grid.  g = 2^floor(log2(Delta / (K sqrt(n)))) with K = 2^10, so that rounding adds at most Delta/K (0.1 %) to
the sensitivity and to sigma; derived from public quantities only (Delta, n).  It is never below ulp(scale) --
the float64 spacing at the public bound ``scale`` on the state's magnitude (the domain radius) -- since a finer
grid than the state's own resolution buys nothing and would make round(theta/g) overflow int64-sized integers.

Feasibility (issue 13 item 2).  sigma'/g = (sigma/Delta)(Delta/g + sqrt(n)) <= (2K + 1) sqrt(n) sigma/Delta: the
noise multiplier alone decides it, and no choice of grid can lower it below sqrt(n) sigma/Delta (a coarser grid
raises Delta' and sigma' with it).  The exact sampler draws int64s; every family therefore checks at creation
(calibration.release_checks) that this bound stays <= 2^56 (draws below 64 sigma'/g = 2^62 except with
probability < exp(-2000)) at the last deletion its ledger certifies; the unbounded omega series checks its first
deletion there and refuses a later one whose bound exceeds 2^56 as capacity exhausted, before anything changes
(calibration.require_release_feasible).

Round-off floor (issue 14, case 2).  A certified shift Delta is a bound on the distance between the two worlds in
exact arithmetic; their float64 computations can differ by round-off on top of it.  ``roundoff_floor`` bounds that
by the standard model (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1: a dot product of n terms
errs by at most gamma_n |x|.|y|, gamma_n = n u / (1 - n u), u = 2^-53): one projected gradient step
theta - eta grad, with ||theta|| <= R and ||grad|| <= G, errs by at most e = C (n + 2) u (R + eta G) in l2 (C = 8
covers the dot product, the loss derivative's own evaluation, the update, and the projection's norm and scaling).
Both worlds err independently from the learning step u on (before u they run identical float operations on
identical data, bit for bit), and an error made at step t is contracted (or expanded) by the same per-step factors
as the shift itself, so the gap is at most Delta + 2 sum_{t=u..tau} Gamma(t, tau) e.  Each family states its floor in
its docstring and certifies max(Delta, floor).
"""
from __future__ import annotations

import math

import numpy as np

from . import fast, fast_dgauss
from .fast_dgauss import sigma_for_fast_path
from .noise import SecureGaussianNoise

U64 = 2.0**-53            # unit round-off of float64
GRID_FACTOR = 2.0**10     # K: the rounding adds at most Delta / K to the sensitivity
ROUNDOFF_C = 8.0          # C in the per-step error bound C (n + 2) u (R + eta G)
MECHANISM = "discrete_gaussian"
ROUNDING = "nearest_even"


def grid_resolution(sensitivity: float, n: int, scale: float) -> float:
    """g = 2^floor(log2(Delta / (K sqrt(n)))), never below ulp(scale); a power of two from public numbers only."""
    floor_g = math.ulp(max(float(scale), 1e-300))  # a power of two for every normal float
    if not (sensitivity > 0.0 and math.isfinite(sensitivity)):
        return floor_g
    m, e = math.frexp(sensitivity / (GRID_FACTOR * math.sqrt(n)))  # x = m 2^e, m in [0.5, 1): 2^(e-1) <= x
    return max(math.ldexp(1.0, e - 1), floor_g)


def step_roundoff(n: int, radius: float, step_norm: float) -> float:
    """l2 float64 error bound of one computed projected step theta - eta grad: C (n + 2) u (R + ||eta grad||)."""
    return ROUNDOFF_C * (n + 2) * U64 * (radius + step_norm)


def roundoff_floor(per_step: float, steps: int, contraction: float = 1.0) -> float:
    """2 sum_{j=0..steps-1} c^j e: the round-off two coupled float64 runs can add to their gap over ``steps``
    steps whose exact maps are c-Lipschitz (c < 1 contracts, c = 1 non-expansive, c > 1 expands)."""
    if steps <= 0 or per_step <= 0.0:
        return 0.0
    if contraction < 1.0:
        total = min(float(steps), 1.0 / (1.0 - contraction))
    elif contraction == 1.0:
        total = float(steps)
    else:
        try:
            total = math.expm1(steps * math.log(contraction)) / (contraction - 1.0)
        except OverflowError:
            return math.inf
    return 2.0 * per_step * total


def add_discrete_noise(theta: np.ndarray, grid: float, sigma: float, noise, radius: float | None = None) -> np.ndarray:
    """Pi_K(g (round(theta / g) + k)), k ~ N_Z(0, (sigma / g)^2)^n: the release with known (public) grid and sigma.

    Coupled replays call this with a certificate's grid and sigma so both worlds draw the same k.  With the
    production source (SecureGaussianNoise) the draws and the rounding run in one compiled call
    (fast_dgauss.secure_release: the same law and the same float operations as the general route below)."""
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    if sigma <= 0.0:
        return theta.copy() if radius is None else fast.project(theta, radius)
    if type(noise) is SecureGaussianNoise:  # production: draw and round in one compiled call (same law, same ops)
        out = fast_dgauss.secure_release(theta, sigma / grid, grid, radius)
        if out is not None:
            return out
    k = np.asarray(noise.discrete_gaussian(sigma / grid, theta.shape[0]), dtype=np.int64)
    return fast.grid_noise_step(theta, k, grid, radius)


def discrete_release(theta: np.ndarray, sensitivity: float, sigma: float, noise, *, scale: float,
                     radius: float | None = None) -> tuple[np.ndarray, float, float, float]:
    """Release theta through the discrete Gaussian: (published, grid, sigma_used, sensitivity_used).

    ``sensitivity`` Delta and ``sigma`` are the family's certified continuous-mechanism figures (Delta already
    at least the family's round-off floor); ``scale`` is the public bound on |theta| (the domain radius) that
    bounds the grid from below; ``radius`` projects onto the L2 ball afterwards (post-processing) when given.
    sensitivity_used = Delta + g sqrt(n) is the l2 distance the released lattice points of the two worlds can
    have; sigma_used = sigma Delta'/Delta (rounded up slightly, see below) keeps
    Delta'^2 / (2 sigma_used^2) <= Delta^2 / (2 sigma^2), the charge the family certified (CKS20 Thm 14).
    With sigma = 0 nothing is noised (an exact release): theta is returned as is, grid 0.
    With the production source (SecureGaussianNoise) everything below, from the grid to the projection, runs in
    one compiled call (fast_dgauss.secure_discrete_release: the same float operations, bit-identical figures and
    output for the same key; tests/test_discrete_release.py); inputs it does not handle take this Python route.
    """
    if sigma > 0.0 and type(noise) is SecureGaussianNoise:  # production: the whole release in one compiled call
        res = fast_dgauss.secure_discrete_release(theta, sensitivity, sigma, scale, radius)  # (same figures, below)
        if res is not None:
            return res
    n = int(theta.shape[0])
    if not sigma > 0.0:
        out = np.array(theta, dtype=np.float64) if radius is None else fast.project(theta, radius)
        return out, 0.0, 0.0, float(sensitivity)
    grid, sigma_used, sens_used = release_figures(sensitivity, sigma, n, scale)
    return add_discrete_noise(theta, grid, sigma_used, noise, radius), grid, sigma_used, sens_used


def release_figures(sensitivity: float, sigma: float, n: int, scale: float) -> tuple[float, float, float]:
    """(grid, sigma_used, sensitivity_used) of ``discrete_release`` for sigma > 0: public functions of (Delta,
    sigma, n, scale) only, so a family can know before releasing what its releases will use (descent-to-delete's
    perfect variant carries them into its bound)."""
    if sensitivity > 0.0:
        grid = grid_resolution(sensitivity, n, scale)
        sens_used = sensitivity + grid * math.sqrt(n)
        sigma_used = sigma * (sens_used / sensitivity)
    else:  # the two worlds are identical (Delta = 0): rounding them gives the same lattice point
        grid = grid_resolution(sigma, n, scale)
        sens_used, sigma_used = 0.0, sigma
    # round sigma'/g UP to 29 significant bits (at most 2^-28 relative for sigma'/g >= 1, the usual case as
    # g <= Delta/(K sqrt n); below 1 up to a multiple of 2^-29): the exact sampler's compiled kernel then applies
    # with room in its int64 bounds (fast_dgauss.sigma_for_fast_path).  More noise than certified: rho = Delta^2/(2 sigma^2) as
    # charged stays an upper bound on Delta'^2/(2 sigma_used^2).  g is a power of two, so sigma_used/g is exact.
    return grid, sigma_for_fast_path(sigma_used / grid) * grid, sens_used


def on_grid(values: np.ndarray, grid: float) -> bool:
    """Whether every value is an integer multiple of ``grid`` (tests, audits)."""
    q = np.asarray(values, dtype=np.float64) / grid
    return bool(np.all(q == np.rint(q)))


def record_release(taus: list, grids: list, tau: int, grid: float) -> None:
    """Append a release at time ``tau`` on grid g to a family's release history (one row per time, the grids of the
    releases at that time summed): the history ``rerounding`` reads."""
    if grid > 0.0:
        if taus and taus[-1] == tau:
            grids[-1] += grid
        else:
            taus.append(tau)
            grids.append(grid)


def rerounding(taus, grids, since: int, n: int, contraction=None, before: float = math.inf) -> float:
    """sum over the releases r at since <= tau_r < before of g_r sqrt(n) c(tau_r) (c = contraction(tau_r) to the
    present, 1 when None): what re-rounding at those releases adds to a shift carried through them (issue 21 /
    issue 29 item 7): both worlds round their own point to the release's lattice, so the carried part of their gap
    grows by up to g sqrt(n) per release (each coordinate's rounding moves it by at most g/2, twice)."""
    root_n = math.sqrt(n)
    return sum(g * root_n * (1.0 if contraction is None else contraction(t)) for t, g in zip(taus, grids)
               if since <= t < before)


def load_release_history(state, releases_so_far: int, t: int, max_grid) -> tuple[list, list]:
    """The (times, grids) release history of a stored state: as stored, or, for a state stored before the history
    was kept, every one of the epoch's ``releases_so_far`` releases counted at the current step ``t`` on the largest
    grid (``max_grid()``, called only then): conservative, never less than what the releases re-rounded."""
    if "release_tau" in state:
        taus = np.asarray(state["release_tau"], dtype=np.int64).reshape(-1).tolist()
        grids = np.asarray(state["release_grid"], dtype=np.float64).reshape(-1).tolist()
        if len(taus) != len(grids):
            raise ValueError("stored release arrays have different lengths")
        return taus, grids
    if releases_so_far:
        return [t], [releases_so_far * max_grid()]
    return [], []

