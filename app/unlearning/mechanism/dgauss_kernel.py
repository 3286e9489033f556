"""The compiled discrete Gaussian sampler's kernel source (numba; the dispatch and the Python API are in
fast_dgauss.py).  The functions below are plain Python that ``compile_kernels`` turns into numba kernels,
rebinding this module's names so that callers compile against the compiled callees; numba's cache is keyed by
this file's path.

The kernel runs CKS20 Algorithms 1-3 exactly as ``noise._dgauss_one`` does, in int64 arithmetic, reading the same
bit stream: the ChaCha20 keystream (RFC 8439) of the call's key, generated here block by block from the key and the
bit position (``_chacha_block``; checked against ``cryptography``'s ChaCha20 and the RFC 8439 test vector in
tests/test_discrete_gaussian.py).  For the same key and position the kernel and the pure path consume the same
bits and return the same draws.

Overflow bound (why int64 suffices).  Let sigma^2 = N/D (lowest terms), t = floor(sigma) + 1.  The kernel is used
only when t^2 D <= 2^62 and 2N <= 2^62 (``params``): every denominator it draws against (t, t^2 D, 2N, the series
counter K) is then <= 2^62.  ``randbelow`` (only for U on [0, t)) needs at most 62 bits per try; a Bernoulli
(num/den) compares bits with the digits of num/den by long division on a remainder r < den, so 2r < 2^63.
Per candidate:
  * Laplace:  x = u + t v with u < t; the kernel requires v <= vmax = 2^62 // t - 1, so t v <= 2^62 - t and
    x <= 2^62 - 1.
  * Acceptance: e = | |Y| t D - N |; the kernel requires |Y| <= ymax = 2^62 // (t D), so |Y| t D <= 2^62 and,
    with 0 < N <= 2^61, |e| <= 2^62.  Only e, t^2 D, 2N, their quotients (<= e) and remainders are formed; the
    exponent's own numerator e^2 and denominator 2 N t^2 D never are (noise._bern_exp_product).
  * K (series counter), the loop counters xi, yi: at most the number of iterations run, far below 2^62.
A candidate outside these bounds makes the kernel stop before that draw and report it; the pure path then redoes
that draw from the bit position where it started (so the stream, and the result, are the same as the pure path's)
and the kernel resumes after it (``_finish``).  ymax / t = 2^62 / (t^2 D), so how often that happens depends on
sigma's mantissa: with 30 significant bits it could be 4 (a Laplace candidate beyond ymax with probability ~e^-4
per try; at sigma ~ 2.6e4, typical of a forget, about one forget in twenty took the pure path); with the 29 bits
of ``sigma_for_fast_path`` it is at least 16 below 2^29 (probability ~e^-16 per try).  A sigma with
t^2 D > 2^62 or 2N > 2^62 (sigma > 2^30.5, or a sigma whose mantissa has more than ~30 significant bits, e.g.
3.7) runs on the pure path entirely (~10 us per draw).
"""
from __future__ import annotations

import math

import numpy as np

from . import fast

LIMIT = 2**62  # every int64 the kernel forms stays <= this (the overflow bound above)
_M32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_S7, _S8, _S12, _S16, _S20, _S24, _S25, _S32 = (np.uint64(v) for v in (7, 8, 12, 16, 20, 24, 25, 32))
_C0, _C1, _C2, _C3 = (np.uint64(v) for v in (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574))  # "expand 32-byte k"
_ZERO = np.uint64(0)
_BLOCK_LIMIT = 2**32  # the 32-bit block counter of RFC 8439


def _qr(a, b, c, d):
    """The ChaCha quarter round (RFC 8439 §2.1) on 32-bit values held in uint64."""
    a = (a + b) & _M32
    d ^= a
    d = ((d << _S16) | (d >> _S16)) & _M32
    c = (c + d) & _M32
    b ^= c
    b = ((b << _S12) | (b >> _S20)) & _M32
    a = (a + b) & _M32
    d ^= a
    d = ((d << _S8) | (d >> _S24)) & _M32
    c = (c + d) & _M32
    b ^= c
    b = ((b << _S7) | (b >> _S25)) & _M32
    return a, b, c, d


def _chacha_block(key, counter):
    """Block ``counter`` of the ChaCha20 keystream of ``key`` (eight 32-bit words in uint64; nonce 0) as eight
    little-endian 64-bit words."""
    k0, k1, k2, k3, k4, k5, k6, k7 = key
    n0 = np.uint64(counter) & _M32
    x0, x1, x2, x3 = _C0, _C1, _C2, _C3
    x4, x5, x6, x7, x8, x9, x10, x11 = k0, k1, k2, k3, k4, k5, k6, k7
    x12, x13, x14, x15 = n0, _ZERO, _ZERO, _ZERO
    for _ in range(10):  # 20 rounds: column round + diagonal round (RFC 8439 §2.3)
        x0, x4, x8, x12 = _qr(x0, x4, x8, x12)
        x1, x5, x9, x13 = _qr(x1, x5, x9, x13)
        x2, x6, x10, x14 = _qr(x2, x6, x10, x14)
        x3, x7, x11, x15 = _qr(x3, x7, x11, x15)
        x0, x5, x10, x15 = _qr(x0, x5, x10, x15)
        x1, x6, x11, x12 = _qr(x1, x6, x11, x12)
        x2, x7, x8, x13 = _qr(x2, x7, x8, x13)
        x3, x4, x9, x14 = _qr(x3, x4, x9, x14)
    x0, x1, x2, x3 = (x0 + _C0) & _M32, (x1 + _C1) & _M32, (x2 + _C2) & _M32, (x3 + _C3) & _M32
    x4, x5, x6, x7 = (x4 + k0) & _M32, (x5 + k1) & _M32, (x6 + k2) & _M32, (x7 + k3) & _M32
    x8, x9, x10, x11 = (x8 + k4) & _M32, (x9 + k5) & _M32, (x10 + k6) & _M32, (x11 + k7) & _M32
    x12 = (x12 + n0) & _M32
    return (x0 | (x1 << _S32), x2 | (x3 << _S32), x4 | (x5 << _S32), x6 | (x7 << _S32),
            x8 | (x9 << _S32), x10 | (x11 << _S32), x12 | (x13 << _S32), x14 | (x15 << _S32))


# The bit reader's state is a tuple (bit position, index of the cached block, the cached block, counter exhausted,
# index of the last word read, that word)
# passed and returned by value: numba calls that pass arrays pay ~30 ns of reference counting each, tuples do not.

def _word(key, st, i):
    """The i-th 64-bit keystream word (the last word read is kept in the state: most reads are single bits of it)."""
    pos, bidx, blk, bad, widx, w = st
    if i == widx:
        return w, st
    b = i >> 3
    if b != bidx:
        if b >= _BLOCK_LIMIT:
            return _ZERO, (pos, bidx, blk, True, widx, w)
        blk = _chacha_block(key, b)
        bidx = b
    w = blk[i & 7]
    return w, (pos, bidx, blk, bad, i, w)


def _take(key, st, k):
    """The next k bits (1 <= k <= 63), most significant first, as int64 (noise.ChaChaBits.take)."""
    pos = st[0]
    w0 = pos >> 6
    off = pos & 63
    w, st = _word(key, st, w0)
    if off + k <= 64:
        v = np.int64((w << np.uint64(off)) >> np.uint64(64 - k))
    else:
        r = off + k - 64
        hi = w & ((_ONE << np.uint64(64 - off)) - _ONE)
        lo, st = _word(key, st, w0 + 1)
        v = np.int64((hi << np.uint64(r)) | (lo >> np.uint64(64 - r)))
    return v, (pos + k, st[1], st[2], st[3], st[4], st[5])


def _bitlen(m):
    """Bit length of m >= 1."""
    k = 1
    if m >= 4294967296:
        m >>= 32
        k += 32
    if m >= 65536:
        m >>= 16
        k += 16
    if m >= 256:
        m >>= 8
        k += 8
    if m >= 16:
        m >>= 4
        k += 4
    if m >= 4:
        m >>= 2
        k += 2
    if m >= 2:
        k += 1
    return k


def _randbelow(key, st, n):
    """noise.ChaChaBits.randbelow for 1 <= n <= 2^62."""
    if n == 1:
        return 0, st
    k = _bitlen(n - 1)
    while True:
        v, st = _take(key, st, k)
        if v < n:
            return v, st


def _bern_frac(key, st, num, den):
    """noise._bern_frac: U < num/den by lazy bit-by-bit comparison (r < den <= 2^62, so 2r < 2^63)."""
    if num <= 0:
        return False, st
    if num >= den:
        return True, st
    r = num
    while True:
        r += r
        digit = 0
        if r >= den:
            digit = 1
            r -= den
        b, st = _take(key, st, 1)
        if b != digit:
            return b < digit, st
        if r == 0:
            return False, st


def _bern_exp_series(key, st, n1, d1, n2, d2):
    """noise._bern_exp_series."""
    k = 1
    while True:
        a, st = _bern_frac(key, st, n1, d1)
        if not a:
            break
        a, st = _bern_frac(key, st, n2, d2)
        if not a:
            break
        a, st = _bern_frac(key, st, 1, k)
        if not a:
            break
        k += 1
    return (k & 1) == 1, st


def _bern_exp_product(key, st, a1, b1, a2, b2):
    """noise._bern_exp_product."""
    xi = a1 // b1
    xf = a1 - xi * b1
    yi = a2 // b2
    yf = a2 - yi * b2
    for _ in range(xi):
        for _ in range(yi):
            a, st = _bern_exp_series(key, st, 1, 1, 1, 1)
            if not a:
                return False, st
    for _ in range(xi):
        a, st = _bern_exp_series(key, st, yf, b2, 1, 1)
        if not a:
            return False, st
    for _ in range(yi):
        a, st = _bern_exp_series(key, st, xf, b1, 1, 1)
        if not a:
            return False, st
    return _bern_exp_series(key, st, xf, b1, yf, b2)


def _gauss_one(key, st, n, d, t, ttd, two_n, vmax, ymax):
    """noise._dgauss_one in int64: (draw, ok, state), ok False when a bound of the module docstring fails."""
    while True:
        # noise._discrete_laplace
        u, st = _randbelow(key, st, t)
        a, st = _bern_exp_series(key, st, u, t, 1, 1)
        if not a:
            continue
        v = 0
        while True:
            a, st = _bern_exp_series(key, st, 1, 1, 1, 1)
            if not a:
                break
            v += 1
        if v > vmax:
            return 0, False, st
        x = u + t * v
        neg, st = _take(key, st, 1)
        if neg == 1 and x == 0:
            continue
        # noise._dgauss_one's acceptance test
        if x > ymax:
            return 0, False, st
        e = x * t * d - n
        if e < 0:
            e = -e
        a, st = _bern_exp_product(key, st, e, ttd, e, two_n)
        if a:
            return (-x if neg == 1 else x), True, st


def _key_word(key_bytes, j):
    """Little-endian 32-bit word j of the 32-byte key (in uint64)."""
    return (np.uint64(key_bytes[4 * j]) | (np.uint64(key_bytes[4 * j + 1]) << _S8)
            | (np.uint64(key_bytes[4 * j + 2]) << _S16) | (np.uint64(key_bytes[4 * j + 3]) << _S24))


def _kernel(key_bytes, pos0, start, n, d, t, ttd, two_n, vmax, ymax, out):
    """Fill out[start..] with draws from bit position pos0 of the keystream of the 32-byte key; (n, ..., ymax) =
    ``params``'s (N, D, t, t^2 D, 2N, vmax, ymax), passed as scalars (an int64 array built per call cost ~0.7 us).
    Returns (index of the first draw not completed = out.shape[0] when all are, bit position where it starts)."""
    # RFC 8439: the key as eight little-endian 32-bit words (a tuple built directly: a list here was a heap
    # allocation per call)
    key = (_key_word(key_bytes, 0), _key_word(key_bytes, 1), _key_word(key_bytes, 2), _key_word(key_bytes, 3),
           _key_word(key_bytes, 4), _key_word(key_bytes, 5), _key_word(key_bytes, 6), _key_word(key_bytes, 7))
    st = (np.int64(pos0), np.int64(-1), (_ZERO, _ZERO, _ZERO, _ZERO, _ZERO, _ZERO, _ZERO, _ZERO), False,
          np.int64(-1), _ZERO)
    for i in range(start, out.shape[0]):
        first = st[0]
        y, ok, st = _gauss_one(key, st, n, d, t, ttd, two_n, vmax, ymax)
        if not ok or st[3]:
            return i, first
        out[i] = y
    return out.shape[0], st[0]


def _release_kernel(key_bytes, p, q, theta, grid, radius, out):
    """The whole release in one compiled call: sigma = p/q (``secure_release``), so N = p^2, D = q^2 and the rest of
    ``params`` are formed here; k <- draws from the start of the keystream of the key (``_kernel``) and, when all
    are drawn, out <- Pi_K(g (round(theta / g) + k)) (fast._py_noise_step: the operations of fast.grid_noise_step;
    no projection for radius = inf).  Returns the number of draws completed (theta.shape[0] on success; k is not
    returned: the rare caller that needs it redraws it from the same key, which gives the same integers)."""
    n = p * p
    d = q * q
    t = p // q + 1
    k = np.empty(theta.shape[0], dtype=np.int64)
    done, pos = _kernel(key_bytes, 0, 0, n, d, t, t * t * d, 2 * n, LIMIT // t - 1, LIMIT // (t * d), k)
    if done == k.shape[0]:
        _noise_step(theta, k, grid, radius, out)
    return done


_GRID_FACTOR = 2.0**10      # release.GRID_FACTOR (K); checked equal in tests/test_discrete_release.py
_P_MAX_K = 1518500249       # math.isqrt(2^61): sigma = p/q in lowest terms, 2N = 2 p^2 <= 2^62 iff p <= this
_TQ_MAX_K = 2147483648      # math.isqrt(2^62) = 2^31: t^2 D = (t q)^2 <= 2^62 iff t q <= this


def _ulp(x):
    """math.ulp(x) for a positive normal float (2^(e-53) for x = m 2^e, 0.5 <= m < 1)."""
    m, e = math.frexp(x)
    return math.ldexp(1.0, e - 53)


def _discrete_release_kernel(key_bytes, theta, sensitivity, sigma, scale, radius, out):
    """release.discrete_release for sigma > 0 in one compiled call: the grid (release.grid_resolution), the lattice
    sensitivity and sigma' (release.discrete_release), sigma'/g rounded up to 29 significant bits
    (sigma_for_fast_path), its exact ratio p/q in lowest terms (float.as_integer_ratio), the bounds of
    ``secure_release``, then ``_release_kernel``.  Every float operation is the Python code's own (frexp, ldexp,
    sqrt, ceil, *, /, +: correctly rounded, so the results are bit-identical; tests/test_discrete_release.py
    compares them).  Returns (done, grid, sigma_used, sens_used): done = theta.shape[0] on success, -1 when an
    input is outside what this function handles (not finite, sigma'/g beyond the kernel's bounds, ...; nothing
    drawn, the caller takes the Python route), else the number of draws completed before one left the kernel's
    int64 bounds (the caller redraws from the same key, as secure_release does)."""
    n = theta.shape[0]
    if not (sigma > 0.0 and sigma < math.inf and scale < math.inf and sensitivity < math.inf
            and sensitivity >= 0.0):
        return -1, 0.0, 0.0, 0.0
    # release.grid_resolution (scale >= 1e-300 > the smallest normal float, so ulp is 2^(e - 53))
    floor_g = _ulp(scale if scale > 1e-300 else 1e-300)
    sqrt_n = math.sqrt(n)
    base = sensitivity if sensitivity > 0.0 else sigma
    m, e = math.frexp(base / (_GRID_FACTOR * sqrt_n))
    grid = math.ldexp(1.0, e - 1)
    if grid < floor_g:
        grid = floor_g
    if sensitivity > 0.0:
        sens_used = sensitivity + grid * sqrt_n
        sigma_used = sigma * (sens_used / sensitivity)
    else:
        sens_used = 0.0
        sigma_used = sigma
    # sigma_for_fast_path(sigma_used / grid)
    x = sigma_used / grid
    if not (x > 0.0 and x < math.inf):
        return -1, 0.0, 0.0, 0.0
    if x < 1.0:
        s = math.ldexp(float(math.ceil(math.ldexp(x, 29))), -29)
    else:
        m, e = math.frexp(x)
        s = math.ldexp(float(math.ceil(math.ldexp(m, 29))), e - 29)
    sigma_used = s * grid
    # s.as_integer_ratio(): s = M 2^E with M < 2^53 an integer, reduced to lowest terms
    m, e = math.frexp(s)
    mant = np.int64(math.ldexp(m, 53))
    ex = e - 53
    while ex < 0 and (mant & 1) == 0:
        mant >>= 1
        ex += 1
    if ex >= 0:
        if ex > 30 or mant > (_P_MAX_K >> ex):
            return -1, 0.0, 0.0, 0.0
        p = mant << ex
        q = np.int64(1)
    else:
        if ex < -31:
            return -1, 0.0, 0.0, 0.0
        p = mant
        q = np.int64(1) << (-ex)
    if p > _P_MAX_K or (p // q + 1) * q > _TQ_MAX_K:
        return -1, 0.0, 0.0, 0.0
    done = _release_kernel(key_bytes, p, q, theta, grid, radius, out)
    return done, grid, sigma_used, sens_used


_noise_step = fast._py_noise_step  # compiled here too, so that _release_kernel calls it without a dispatch
_PY = {f.__name__: f for f in (_qr, _key_word, _chacha_block, _word, _take, _bitlen, _randbelow, _bern_frac, _bern_exp_series,
                               _bern_exp_product, _gauss_one, _kernel)}
_PY["_noise_step"] = _noise_step
_PY["_release_kernel"] = _release_kernel
_PY["_ulp"] = _ulp
_PY["_discrete_release_kernel"] = _discrete_release_kernel
# the small helpers are inlined into the kernel (numba inline="always"), so the bit reader's state tuple rarely
# crosses a call boundary; _bern_exp_series is not: numba inlines at the IR level at every call site, and its five
# sites (nested through _bern_exp_product) made the cold compilation take ~96 s on an idle 2-core machine, ~3x the
# time with it compiled once and called (issue 31: CI and image builds compile it; the draws are the same integers,
# and 64-draw releases timed side by side were no slower: 22-27 us vs 23-36 us, loaded machine)
_INLINE = frozenset(("_ulp", "_qr", "_key_word", "_word", "_take", "_bitlen", "_randbelow", "_bern_frac",
                     "_bern_exp_product", "_gauss_one"))


def compile_kernels(numba) -> tuple:
    """njit every helper (callees first, rebinding the module names so callers compile against them); returns the
    (sampler, release, discrete release) kernels.  The caller holds its lock."""
    g = globals()
    for name, f in _PY.items():
        opts = {"inline": "always"} if name in _INLINE else {}
        try:
            g[name] = numba.njit(cache=True, nogil=True, **opts)(f)
        except Exception:  # pragma: no cover - e.g. no writable cache directory
            g[name] = numba.njit(nogil=True, **opts)(f)
    return g["_kernel"], g["_release_kernel"], g["_discrete_release_kernel"]
