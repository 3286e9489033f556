"""Compiled path of the exact discrete Gaussian sampler (optional; numba): the dispatch and the Python API.  See
noise.py for the algorithm and dgauss_kernel.py for the kernel, its bit stream and why int64 suffices.

The kernel runs CKS20 Algorithms 1-3 exactly as ``noise._dgauss_one`` does and reads the same bit stream: for the
same key and position the kernel and the pure path consume the same bits and return the same draws.  Importing
this module registers ``sample`` as noise.py's sampler (``noise.use_sampler``): noise.py never imports it.

Speed (d + 1 = 17 draws at sigma ~ 1e4 - 1e5, the size of a forget; 2-core VM shared with other work).  About 60
keystream bits per draw (Bernoulli(num/den) reads 2 bits on average instead of bitlen(den) ~ 60); every helper
but one (dgauss_kernel.py says why) is inlined into the kernel and the bit reader keeps its last word, ~0.15 us per draw, most of it branch
mispredictions on random bits (the same 17 draws from a fixed key take half as long); ``secure_release`` draws,
rounds to the grid and projects in one call (~2 us fixed: os.urandom, dispatch, first block);
``secure_discrete_release`` also computes the grid, sigma', its 29-bit rounding and exact ratio in that call
(release.discrete_release's production route: ~1-1.5 us of Python per forget less, bit-identical figures).

Randomness.  Per call: one 256-bit ChaCha20 key from os.urandom (``noise.SecureRandomBits``) - 32 bytes from the
kernel (~0.3 us) instead of reading every random bit from os.urandom (a 2 KiB read costs ~4 us, more than the
draws), and no keystream buffer to size or run out of.  The key lives for one call and is not stored.
Without numba (or with OLU_NUMBA=0) ``available()`` is False and every draw takes the pure path.
"""
from __future__ import annotations

import math
import os
import threading

import numpy as np

from . import dgauss_kernel as kern
from . import fast, noise
from .warmup import BackgroundCompile

try:  # pragma: no cover - depends on the environment
    if os.environ.get("OLU_NUMBA", "1").strip().lower() in ("0", "false", "no", "off"):
        raise ImportError("disabled by OLU_NUMBA=0")
    import numba
    _IMPORT_ERROR: str | None = None
except ImportError as e:  # pragma: no cover - depends on the environment
    numba = None
    _IMPORT_ERROR = str(e)

enabled = True  # tests and the benchmark switch the compiled path off with ``set_enabled(False)``

LIMIT = kern.LIMIT  # the kernel's int64 bound (dgauss_kernel.py)


_compiled = None
_compiled_release = None
_compiled_discrete_release = None
_lock = threading.Lock()


def _compile():
    """Compile the kernels (dgauss_kernel.compile_kernels) once."""
    global _compiled, _compiled_release, _compiled_discrete_release
    with _lock:
        if _compiled is None:
            k, r, dr = kern.compile_kernels(numba)
            _compiled_release = r
            _compiled_discrete_release = dr
            _compiled = k
    return _compiled


_ready = False  # the three kernels are compiled (or loaded from the cache): until then callers take the pure path


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel now; a no-op without numba."""
    global _ready
    if numba is not None:  # (also when switched off by set_enabled: tests compare the two routes)
        k = _compile()
        k(bytes(32), 0, 0, *params(1.0)[4], np.empty(1, np.int64))
        _compiled_release(bytes(32), 1, 1, np.zeros(1), 1.0, 1.0, np.empty(1))
        _compiled_discrete_release(bytes(32), np.zeros(1), 1.0, 1.0, 1.0, 1.0, np.empty(1))
        _ready = True


def ready() -> bool:
    """Whether the kernels are loaded; until then every draw takes the pure path (the same draws, bit for bit) and
    no request waits for the compiler (issue 23): the first such draw starts the background compilation."""
    if not _ready:
        warm_up_async()
    return _ready


_background = BackgroundCompile(warm_up, "olu-numba-dgauss-warm-up")


def warm_up_async() -> None:
    """``warm_up`` in a background thread, once per process, so that no forget pays for the compilation."""
    if numba is not None:
        _background.start()


def warming() -> bool:
    """Whether ``warm_up_async``'s compilation still runs."""
    return _background.running()


def available() -> bool:
    return numba is not None and enabled


def unavailable_reason() -> str | None:
    return None if numba is not None else f"numba is not importable ({_IMPORT_ERROR})"


def set_enabled(flag: bool) -> bool:
    """Switch the compiled path on or off (benchmarks, equality tests); returns the previous setting."""
    global enabled
    previous, enabled = enabled, bool(flag)
    return previous


def params(sigma: float) -> tuple[int, int, int, bool, tuple[int, ...] | None]:
    """(N, D, t, fits, prm) for sigma: prm = (N, D, t, t^2 D, 2N, vmax, ymax) if the kernel's bounds hold (module
    docstring), else None.  Integer operations only (noise._dgauss_params), so not cached: sigma changes with
    every forget."""
    n, d, t = noise._dgauss_params(sigma)
    ttd, two_n = t * t * d, 2 * n
    if ttd <= LIMIT and two_n <= LIMIT:
        return n, d, t, True, (n, d, t, ttd, two_n, LIMIT // t - 1, LIMIT // (t * d))
    return n, d, t, False, None


SIGNIFICANT_BITS = 29    # sigma_for_fast_path: sigma >= 1 rounded up to this many significant bits ...
SMALL_SIGMA_STEP = -29   # ... and sigma < 1 up to a multiple of 2^-29


def sigma_for_fast_path(sigma: float) -> float:
    """A float s >= sigma with s - sigma <= max(sigma 2^-28, 2^-29) that the kernel accepts whenever sigma <= 2^30,
    with room to spare: sigma rounded up to 29 significant bits, or for sigma < 1 to a multiple of 2^-29.  A
    caller that wants the compiled path calibrates with this s (more noise, never less).

    Why it fits: for 1 <= s < 2^29 (2^(E-1) <= s < 2^E, 1 <= E <= 29; s = 2^E exactly has D = 1) s = r 2^(E-29)
    with r <= 2^29, so N = r^2 <= 2^58, t <= 2^E and D <= 2^(2(29-E)): t^2 D <= 2^58.  Then ymax = 2^62 // (t D)
    >= 16 t, so a Laplace candidate leaves the kernel's bounds with probability about exp(-16) < 2e-7 per try
    (with 30 significant bits ymax could be 4 t: e^-4 = 2 %; sigma ~ 2.6e4, typical of a forget, sent about one
    forget in twenty through the pure path).  For 2^29 <= s <= 2^30 s is an integer, D = 1, N <= 2^60,
    t^2 < 2^61 (ymax >= 4 t there; such draws resume in the kernel after the pure path redoes them).  Below 1:
    s = M 2^-29 with M <= 2^29, t <= 2, D <= 2^58, N <= 2^58, ymax >= 16.  Above 2^30.5, 2N > 2^62 and the pure
    path runs whatever the rounding.
    """
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a finite positive number, got {sigma!r}")
    if sigma < 1.0:
        return math.ldexp(math.ceil(math.ldexp(sigma, -SMALL_SIGMA_STEP)), SMALL_SIGMA_STEP)
    m, e = math.frexp(sigma)                            # sigma = m 2^e, 0.5 <= m < 1
    r = math.ceil(math.ldexp(m, SIGNIFICANT_BITS))      # exact: an integer <= 2^29
    return math.ldexp(r, e - SIGNIFICANT_BITS)          # exact


KERNEL_EXACT_BELOW = 2.0**29  # sigma'/g below this: every kernel draw stays in its bounds but for ~exp(-16)


def route(sigma: float) -> str:
    """Which sampler draws at ``sigma`` (grid units) take once the kernel is loaded (the work estimate counts it,
    app/unlearning/maths/work_budget.py): "kernel"; "kernel_fallback" for 2^29 <= sigma <= 2^30.5, where a few
    percent of the draws leave the kernel's bounds and are redone by the pure path (sigma_for_fast_path's
    docstring); "pure" beyond, where 2N > 2^62 and every draw takes the pure path (~50 us each, 200x the
    kernel's)."""
    if not params(sigma)[3]:
        return "pure"
    return "kernel" if sigma < KERNEL_EXACT_BELOW else "kernel_fallback"


def sample(sigma: float, size: int, rand) -> np.ndarray:
    """noise.sample_discrete_gaussian: the compiled kernel when it applies, the pure path for the rest.

    A draw whose candidate leaves the kernel's int64 bounds is redone by the pure path from the bit position where
    it started (the same bits, so the same draw), and the kernel resumes after it."""
    n, d, t, fits, prm = params(sigma)
    size = noise._check_size(size)
    if not fits or not enabled or not ready():
        return noise.sample_discrete_gaussian_pure(sigma, size, rand)
    out = np.empty(size, dtype=np.int64)
    kernel = _compiled
    if type(rand) is noise.SecureRandomBits:  # its stream(), without building the object unless it is needed
        bits, key, pos = None, os.urandom(32), 0
    else:
        bits = rand.stream()
        key, pos = bits.key, bits.pos
    start, pos = kernel(key, pos, 0, *prm, out)
    if start < size:
        _finish(kernel, key, pos, start, prm, out, bits)
    elif bits is not None:
        bits.pos = pos
    return out


def _finish(kernel, key, pos, start, prm, out, bits):
    """Complete out[start..] after the kernel stopped at draw ``start`` (bit position pos): the pure path redoes
    that draw from pos on the same stream, then the kernel resumes.  Returns the stream, at the end position."""
    n, d, t = prm[0], prm[1], prm[2]
    size = out.shape[0]
    if bits is None:
        bits = noise.ChaChaBits(key, pos)
    while start < size:
        bits.pos = pos
        out[start] = noise._dgauss_int64(bits, n, d, t)
        start, pos = kernel(key, bits.pos, start + 1, *prm, out)
    bits.pos = pos
    return bits


_F64 = np.dtype(np.float64)
_P_MAX = math.isqrt(LIMIT // 2)   # sigma = p/q in lowest terms: 2N = 2 p^2 <= 2^62 iff p <= _P_MAX
_TQ_MAX = math.isqrt(LIMIT)       # t^2 D = (t q)^2 <= 2^62 iff t q <= 2^31


def secure_release(theta: np.ndarray, sigma: float, grid: float, radius: float | None) -> np.ndarray | None:
    """Pi_K(g (round(theta / g) + k)), k ~ N_Z(0, sigma^2)^n (sigma in grid units) with production randomness (a
    fresh os.urandom ChaCha20 key, as noise.SecureGaussianNoise.discrete_gaussian), drawing and rounding in one
    compiled call; the same result as fast.grid_noise_step(theta, sample(sigma, n, SECURE_BITS), grid, radius)
    for the same key (tests/test_discrete_release.py).  theta: a C-contiguous float64 vector (release.py's
    ascontiguousarray).  None when the compiled path does not apply (no numba, switched off, sigma not a positive
    float within the kernel's bounds): the caller takes the general route.  Nothing is kept.

    ``params``' bounds are checked on sigma = p/q directly (p, q from float.as_integer_ratio, lowest terms) and
    the kernel forms N, D, t and the rest itself: the per-call Python work is a few integer operations, one
    os.urandom read, one np.empty and one dispatch returning an int (returning arrays from numba costs ~0.4 us)."""
    if not ready() or not enabled or type(sigma) is not float or not 0.0 < sigma < math.inf or theta.ndim != 1:
        return None
    p, q = sigma.as_integer_ratio()
    if p > _P_MAX or (p // q + 1) * q > _TQ_MAX:
        return None
    kernel = _compiled_release
    key = os.urandom(32)
    out = np.empty(theta.shape[0])
    if kernel(key, p, q, theta, float(grid), math.inf if radius is None else float(radius), out) == out.shape[0]:
        return out
    # a draw left the kernel's bounds (rare, module docstring): the same draws again from the same key, the pure
    # path for the ones outside the bounds, then the general rounding
    k = np.empty(theta.shape[0], dtype=np.int64)
    prm = params(sigma)[4]
    done, pos = _compiled(key, 0, 0, *prm, k)
    if done < k.shape[0]:
        _finish(_compiled, key, pos, done, prm, k, None)
    return fast.grid_noise_step(theta, k, grid, radius)


def secure_discrete_release(theta: np.ndarray, sensitivity: float, sigma: float, scale: float,
                            radius: float | None) -> tuple[np.ndarray, float, float, float] | None:
    """release.discrete_release(theta, sensitivity, sigma, SecureGaussianNoise(), scale=scale, radius=radius) for
    sigma > 0 in one compiled call (``_discrete_release_kernel``): the same (published, grid, sigma_used,
    sensitivity_used), bit for bit, for the same key.  None when the compiled path does not apply (no numba,
    switched off, theta not a float64 vector, an input the kernel hands back): the caller takes the Python route.
    The key is 32 fresh os.urandom bytes, as ``secure_release``'s; nothing is kept."""
    if not ready() or not enabled:
        return None
    kernel = _compiled_discrete_release
    if type(theta) is not np.ndarray or theta.dtype is not _F64 or theta.ndim != 1 or not theta.flags.c_contiguous:
        return None
    key = os.urandom(32)
    out = np.empty(theta.shape[0])
    done, grid, sigma_used, sens_used = kernel(key, theta, float(sensitivity), float(sigma), float(scale),
                                               math.inf if radius is None else float(radius), out)
    if done == out.shape[0]:
        return out, grid, sigma_used, sens_used
    if done < 0:
        return None
    # a draw left the kernel's bounds (rare, module docstring): as secure_release, the same draws again from the
    # same key, the pure path for the ones outside the bounds, then the general rounding
    k = np.empty(theta.shape[0], dtype=np.int64)
    prm = params(sigma_used / grid)[4]
    done, pos = _compiled(key, 0, 0, *prm, k)
    if done < k.shape[0]:
        _finish(_compiled, key, pos, done, prm, k, None)


noise.use_sampler(sample)
