"""Compiled inner loop for passive OLU's per-example OGD steps (optional; numba).

``PassiveOLU.learn`` runs one projected OGD step per example:

    g_t     = l'(theta . x~_t, y_t) x~_t + mu theta          (x~ = (x, 1); losses.Loss.grad)
    theta_t = Pi_K(theta_{t-1} - eta_t g_t)                    (K = L2 ball of radius R; domain.project_l2_ball)

In numpy each step costs a handful of small-array allocations and Python calls (~10 us), which dominates the
service's learn path.  ``ogd_steps`` runs the same recursion in one compiled loop.  It is used only for the
schedules whose step size is a public function of the clock alone (``strongly_convex_capped``,
``strongly_convex``, ``convex_constant``, ``regularized_convex``): eta_t is computed with the very same
floating-point expression as ``schedules.py``, so the certified constants (L, beta, mu, Delta_t, Gamma) are
untouched.  The adaptive schedule (data-dependent steps) and reference runs with an ``eta_script`` keep the numpy
loop.

Results agree with the numpy loop to round-off (the dot products are summed in a different order):
``tests/test_fast_path.py`` checks <= 1e-12 on random streams.  Without numba (or with ``OLU_NUMBA=0`` in the
environment) ``available()`` is False and the numpy loop runs; nothing else changes.

The exact families (retrain, sisa) need more than round-off agreement: a forget's replay must do the very
operations the learning did.  ``exact_ogd_at`` runs their loop (exact_ogd.py): the compiled kernel once loaded,
else a fallback with the same bits, so the cold start below cannot break an exact forget (issue 32).

No request waits for the compiler (issue 23): until the kernels are loaded (``ready()``), ``supported`` is False
and ``grid_noise_step`` takes numpy, and the compilation runs in a background thread (``warm_up_async``, started
by the service at start-up or by the first caller).  With numba's cache filled (``olu warm``; the image does it at
build time into ``NUMBA_CACHE_DIR``) loading takes about a second.
"""
from __future__ import annotations

import math
import os
import threading

import numpy as np

from ..maths.domain import project_l2_ball
from ..maths.losses import Loss
from ..maths.schedules import CappedStronglyConvex, ConstantStep, Schedule, StronglyConvex
from . import exact_ogd
from .warmup import BackgroundCompile

LOSS_CODES = {"logistic": 0, "squared": 1, "huber": 2}

try:  # pragma: no cover - depends on the environment
    if os.environ.get("OLU_NUMBA", "1").strip().lower() in ("0", "false", "no", "off"):
        raise ImportError("disabled by OLU_NUMBA=0")
    import numba
    _IMPORT_ERROR: str | None = None
except ImportError as e:  # pragma: no cover - depends on the environment
    numba = None
    _IMPORT_ERROR = str(e)

_kernel = None
enabled = True  # benchmarks and tests switch the compiled path off with ``set_enabled(False)``


def _py_ogd_steps(theta, X, y, clock0, cap, t_switch, mu_sched, loss_code, mu, huber_delta, radius):
    """The kernel's source (compiled by numba; also runnable as plain Python for debugging)."""
    n, d = X.shape
    eta = math.nan
    for i in range(n):
        t = clock0 + i + 1
        # schedules.py: CappedStronglyConvex.eta / StronglyConvex.eta / ConstantStep.eta, same expressions
        if t < t_switch:
            eta = cap
        else:
            eta = 1.0 / (mu_sched * t)
        s = theta[d]  # the bias times the augmented feature 1
        for j in range(d):
            s += X[i, j] * theta[j]
        if loss_code == 0:
            r = 0.5 * (1.0 + math.tanh(0.5 * s)) - y[i]
        else:
            r = s - y[i]
            if loss_code == 2:
                if r > huber_delta:
                    r = huber_delta
                elif r < -huber_delta:
                    r = -huber_delta
        sq = 0.0
        for j in range(d):
            v = theta[j] - eta * (r * X[i, j] + mu * theta[j])
            theta[j] = v
            sq += v * v
        v = theta[d] - eta * (r + mu * theta[d])
        theta[d] = v
        sq += v * v
        norm = math.sqrt(sq)
        if norm > radius:
            f = radius / norm
            for j in range(d + 1):
                theta[j] = theta[j] * f
    return eta


def _py_noise_step(theta, k, grid, radius, out):
    """out <- Pi_K(g (round(theta / g) + k)), K the L2 ball of radius R: the discrete release (release.py, P4/P5).

    g is a power of two, so theta / g, the rounding (to nearest, ties to even: np.rint) and g * integer are exact
    in float64; k holds the discrete Gaussian integers.  The same operations as
    ``domain.project_l2_ball(grid * (np.rint(theta / grid) + k), R)`` in one compiled call (~0.5 us instead of a
    few us of numpy dispatch on a (d + 1)-vector).  The pre-projection lattice point is bit-identical; the norm is
    summed in index order where numpy's dot may use another order, so when the projection binds the result can
    differ from the numpy path in the last bit (tests/test_forget_path.py) -- a function of the lattice point only.
    """
    n = theta.shape[0]
    if k.shape[0] != n or out.shape[0] != n:
        raise ValueError("theta, k and out must have the same length")
    sq = 0.0
    for j in range(n):
        w = grid * (np.rint(theta[j] / grid) + k[j])
        out[j] = w
        sq += w * w
    norm = math.sqrt(sq)
    if norm > radius:
        f = radius / norm
        for j in range(n):
            out[j] = out[j] * f


_noise_kernel = None
_exact_kernel = None
_NOISE_SIGNATURE = "void(float64[::1], int64[::1], float64, float64, float64[::1])"


def _compile():
    global _kernel, _noise_kernel, _exact_kernel
    if _kernel is None:
        try:
            kernel = numba.njit(cache=True, nogil=True)(_py_ogd_steps)
            kernel(np.zeros(2), np.zeros((1, 1)), np.zeros(1), 0, 1.0, 2, 1.0, 0, 0.1, 1.0, 1.0)
            # one explicit signature: compiled here, never lazily on a forget; other argument types raise TypeError
            # and take the numpy path (grid_noise_step)
            noise_kernel = numba.njit(_NOISE_SIGNATURE, cache=True, nogil=True)(_py_noise_step)
            exact_kernel = numba.njit(exact_ogd.SIGNATURE, cache=True, nogil=True)(exact_ogd._py_ogd_at)
        except Exception:  # pragma: no cover - e.g. no writable cache directory: compile without caching
            kernel = numba.njit(nogil=True)(_py_ogd_steps)
            noise_kernel = numba.njit(_NOISE_SIGNATURE, nogil=True)(_py_noise_step)
            exact_kernel = numba.njit(exact_ogd.SIGNATURE, nogil=True)(exact_ogd._py_ogd_at)
        _noise_kernel = noise_kernel
        _exact_kernel = exact_kernel
        _kernel = kernel
    return _kernel


_compile_lock = threading.Lock()  # held while compiling: warm_up() in a thread waits for a running warm-up


def _compile_locked():
    with _compile_lock:
        return _compile()


_background = BackgroundCompile(_compile_locked, "olu-numba-warm-up")


def warm_up_async() -> None:
    """Compile (or load from numba's cache) the kernel in a background thread, once per process, so that the first
    learn request does not pay for it.  A no-op without numba."""
    if numba is not None:
        _background.start()


def warming() -> bool:
    """Whether ``warm_up_async``'s compilation still runs."""
    return _background.running()


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels now, in this thread; a no-op without numba (``olu warm``,
    tests that compare the two paths)."""
    if numba is not None:
        _compile_locked()


def ready() -> bool:
    """Whether the compiled kernels are loaded.  Until they are, every caller takes the numpy path (issue 23: no
    request waits for a compiler) and the first such caller starts the background compilation."""
    if _kernel is None:
        warm_up_async()
        return False
    return True


def available() -> bool:
    """Whether the compiled loop can run (numba importable and not disabled)."""
    return numba is not None and enabled


def unavailable_reason() -> str | None:
    return None if numba is not None else f"numba is not importable ({_IMPORT_ERROR})"


def set_enabled(flag: bool) -> bool:
    """Switch the compiled path on or off (benchmarks, equality tests); returns the previous setting."""
    global enabled
    previous, enabled = enabled, bool(flag)
    return previous


def schedule_params(schedule: Schedule) -> tuple[float, int, float] | None:
    """(cap, t_switch, mu_sched): eta_t = cap if t < t_switch else 1/(mu_sched t); None if not expressible."""
    if type(schedule) is CappedStronglyConvex:
        # the clock never reaches 2**62: a larger t0 (mu << beta) means "capped at every step" (int64 argument)
        return schedule.cap, min(int(schedule.t0), 2**62), schedule.mu
    if type(schedule) is StronglyConvex:
        return 0.0, 0, schedule.mu
    if type(schedule) is ConstantStep:
        return schedule.step_size, 2**62, 1.0
    return None


def ogd_steps(theta: np.ndarray, X: np.ndarray, y: np.ndarray, clock0: int, schedule: Schedule, loss,
              radius: float) -> float:
    """Run len(X) projected OGD steps on ``theta`` in place (clock of the first step: clock0 + 1).

    X holds the raw (not augmented) features.  Returns eta of the last step.  Callers check ``supported`` first.
    """
    cap, t_switch, mu_sched = schedule_params(schedule)
    kernel = _kernel if _kernel is not None else _compile_locked()
    return float(kernel(theta, np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64),
                        int(clock0), float(cap), int(t_switch), float(mu_sched), LOSS_CODES[loss.name],
                        float(loss.mu), float(loss.huber_delta), float(radius)))


def exact_supported(schedule: Schedule, loss) -> bool:
    """Whether ``exact_ogd_at`` takes this loss and schedule (the library's scalar losses, a schedule of the clock
    alone), compiled or not: a public property of the spec, never of the warm-up."""
    return type(loss) is Loss and loss.name in LOSS_CODES and schedule_params(schedule) is not None


def _kernel_view(a: np.ndarray) -> np.ndarray:
    """``a`` as the kernel's signature takes it (a writable array; the kernel only reads it): a read-only view of a
    writable array (the retained store's chunks, ArrayRetained's views) is re-viewed writable, without a copy;
    an array over immutable memory is copied."""
    if a.flags.writeable:
        return a
    view = a.view()
    try:
        view.flags.writeable = True
    except ValueError:
        return a.copy()
    return view


def exact_ogd_at(theta: np.ndarray, X: np.ndarray, y: np.ndarray, steps: np.ndarray, schedule: Schedule, loss,
                 radius: float) -> np.ndarray:
    """Projected OGD from ``theta`` (not changed) over the raw rows X, example i at clock steps[i]; the new
    iterate.  The compiled kernel once loaded, else the numpy loop: the same bits either way (exact_ogd.py).
    Callers check ``exact_supported`` first."""
    cap, t_switch, mu_sched = schedule_params(schedule)
    out = np.array(theta, dtype=np.float64, order="C")  # a copy: the loops run in place
    X = _kernel_view(np.ascontiguousarray(X, dtype=np.float64))
    args = (out, X, _kernel_view(np.ascontiguousarray(y, dtype=np.float64)),
            _kernel_view(np.ascontiguousarray(steps, dtype=np.int64)),
            float(cap), int(t_switch), float(mu_sched), LOSS_CODES[loss.name], float(loss.mu),
            float(loss.huber_delta), float(radius))
    if X.shape[1] + 1 != out.shape[0] or len(args[2]) != len(X) or len(args[3]) != len(X):
        raise ValueError("theta, X, y and steps do not match")  # the kernel does not check bounds
    kernel = _exact_kernel if enabled and ready() else None  # ready(): set once the compilation has ended
    (kernel or exact_ogd.fallback_ogd_at)(*args)
    return out


def grid_noise_step(theta: np.ndarray, k: np.ndarray, grid: float, radius: float | None) -> np.ndarray:
    """Pi_K(g (round(theta / g) + k)) as a new array (no projection when radius is None): compiled when available,
    else numpy.  The release step of every noising family (release.add_discrete_noise)."""
    kernel = _noise_kernel if enabled and ready() else None  # both set once the compilation has ended
    if radius is not None and kernel is not None:
        out = np.empty(theta.shape[0])
        try:
            kernel(theta, k, grid, radius, out)
            return out
        except TypeError:  # not contiguous float64 / int64 vectors and two floats: the general path below
            pass
    w = grid * (np.rint(np.asarray(theta, dtype=np.float64) / grid) + np.asarray(k, dtype=np.int64))
    return w if radius is None else project_l2_ball(w, radius)


def project(theta: np.ndarray, radius: float) -> np.ndarray:
    """Pi_K(theta) as a new array."""
    return project_l2_ball(np.array(theta, dtype=np.float64), radius)


def supported(schedule: Schedule, loss) -> bool:
    # only the library's own losses (tests substitute other loss objects, which keep the numpy loop); the kernel
    # is scalar-score only: softmax (not in LOSS_CODES) keeps the numpy loop through the loss object
    # and only once compiled: before that the numpy loop runs (the certificates' round-off floor covers a stream
    # that switches loop mid-way: both loops are float64 runs of the same steps, each within step_roundoff of the
    # exact map; tests/test_fast_path.py)
    if not (available() and type(loss) is Loss and loss.name in LOSS_CODES and schedule_params(schedule) is not None):
        return False
    return ready()
