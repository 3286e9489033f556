"""Gaussian noise sources.

Production noise comes from the OS CSPRNG: every draw seeds a fresh PCG64 with 256 bits read from ``os.urandom``
at that moment, so no seed is ever stored or reproducible from state (ARCHITECTURE.md §3).  Tests inject a seeded
source to couple an unlearning run with its retrain reference (§5).

Seeding.  ``PCG64(seed)`` runs ``SeedSequence(seed).generate_state(4, uint64)`` and hands the four words to
``pcg64_set_seed`` (128-bit initial state, 128-bit stream word w, increment 2w + 1): the SeedSequence hash only
spreads the 128 entropy bits of ``secrets.randbits(128)`` over those 256 bits, and costs ~10 us per draw.
``OsEntropy`` is an ``ISeedSequence`` whose ``generate_state`` returns the requested words straight from
``os.urandom``; the bit generator is seeded by the same ``pcg64_set_seed`` call, with 256 fresh CSPRNG bits instead
of 128 hashed ones.  The object holds no state: each call reads new bytes from the kernel and nothing is kept.

Exact discrete Gaussian (issue 14: floating-point Gaussian samplers leak through their low-order bits, Mironov
CCS 2012).  ``sample_discrete_gaussian(sigma, size, rand)`` returns int64 draws from N_Z(0, sigma^2),
P(k) = exp(-k^2 / 2 sigma^2) / sum_j exp(-j^2 / 2 sigma^2), by Canonne, Kamath & Steinke 2020 ("The Discrete
Gaussian for Differential Privacy"):
  * Algorithm 1, Bernoulli(exp(-g)) for rational g >= 0: for g <= 1, K = 1; while Bernoulli(g/K): K += 1; return
    K odd (P = sum over odd K of g^(K-1)/(K-1)! - g^K/K! = exp(-g)); for g > 1, floor(g) Bernoulli(exp(-1)) and one
    Bernoulli(exp(-(g - floor g))), all of which must be 1.  Here g = x y is always a product of two rationals and
    the integer/fractional split is done on x and y separately (``_bern_exp_product``), and Bernoulli(g/K) is
    the AND of independent Bernoulli(x_f), Bernoulli(y_f), Bernoulli(1/K): the same probabilities (products of
    independent Bernoullis), with every denominator kept to that of x, y or K.
  * Algorithm 2, the discrete Laplace of scale t (s = 1): U uniform on [0, t), accept with Bernoulli(exp(-U/t)),
    V ~ Geometric via Bernoulli(exp(-1)), X = U + t V, a sign bit, -0 rejected.
  * Algorithm 3: t = floor(sigma) + 1; Y ~ Laplace_Z(t), accepted with Bernoulli(exp(-(|Y| - sigma^2/t)^2 /
    (2 sigma^2))).  With sigma^2 = N/D and e = |Y| t D - N the exponent is (|e| / t^2 D) (|e| / 2N).
Exactness: sigma^2 is the rational (p/q)^2 for sigma = p/q (``float.as_integer_ratio``: a float is a dyadic
rational; sigma * sigma in floating point is not used anywhere), and every decision compares uniform bits with
the binary digits of an integer ratio: no floating-point number takes part in sampling, so the output law is
N_Z(0, sigma^2) exactly, given uniform bits.
Randomness: uniform integers on [0, n) take k = bitlen(n - 1) bits and are rejected while >= n (no modulo bias);
Bernoulli(num/den) reads bits one at a time until they first differ from num/den's binary digits (2 bits on
average, ``_bern_frac``), about 60 bits per draw at sigma ~ 1e4 - 1e5 (~350 with a uniform on [0, den) each).
The bits are a ChaCha20 keystream (RFC 8439): ``SecureRandomBits`` keys it with 32 fresh bytes of os.urandom per
sampling call and drops key and stream when the call returns (a CSPRNG keyed by the OS CSPRNG; ChaCha20 is also
what the Linux kernel's getrandom uses); ``SeededRandomBits`` keys it from a seed for tests only.
Speed: ``fast_dgauss.py`` runs the same algorithm in int64 (numba) on the same bits, giving identical draws; its
module docstring proves the int64 bounds and when it hands a draw back to the pure path here.
"""
from __future__ import annotations

import hashlib
import math
import os
from fractions import Fraction
from typing import Protocol

import numpy as np
from numpy.random import PCG64, Generator

from ..contract.errors import checkpoint
from numpy.random.bit_generator import ISeedSequence

_U64 = np.dtype(np.uint64)
_WORD_TYPES = (np.dtype(np.uint32), _U64)


class NoiseSource(Protocol):
    def standard_normal(self, size: int) -> np.ndarray: ...

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray: ...


class OsEntropy(ISeedSequence):
    """Seed words for a bit generator, read from the OS CSPRNG on every call (stateless, never reused)."""

    __slots__ = ()

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if dtype is np.uint64 and n_words == 4:  # what PCG64.__init__ asks for
            return np.frombuffer(os.urandom(32), _U64)  # (positional: ~0.15 us less than dtype=)
        dt = np.dtype(dtype)
        if dt not in _WORD_TYPES:
            raise ValueError("only uint32 and uint64 seed words are supported")
        return np.frombuffer(os.urandom(int(n_words) * dt.itemsize), dt)


OS_ENTROPY = OsEntropy()


def secure_generator() -> Generator:
    """A fresh PCG64 generator seeded with 256 bits from the OS CSPRNG (one per draw or per run; never stored)."""
    return Generator(PCG64(OS_ENTROPY))


class SecureGaussianNoise:
    """N(0, I) draws, each from a generator freshly seeded by the OS CSPRNG; exact discrete Gaussian draws from a
    ChaCha20 stream keyed by 32 fresh ``os.urandom`` bytes per call (nothing seeded or kept)."""

    def standard_normal(self, size: int) -> np.ndarray:
        return Generator(PCG64(OS_ENTROPY)).standard_normal(size)

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        """``size`` independent exact draws from N_Z(0, sigma^2) (int64; sigma in grid units)."""
        return sample_discrete_gaussian(sigma, size, SECURE_BITS)


class SeededNoise:
    """Deterministic N(0, I) and N_Z(0, sigma^2) draws for coupled tests.  Never used by the service.

    ``last`` is the most recent draw of either kind (the coupled-replay harnesses publish the reference with it).
    The two kinds come from independent streams, so the discrete draws of two sources with the same seed agree
    call for call whatever the Gaussian draws in between.
    """

    def __init__(self, seed: int):
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._bits = SeededRandomBits(seed)
        self.last: np.ndarray | None = None

    def standard_normal(self, size: int) -> np.ndarray:
        self.last = self._rng.standard_normal(size)
        return self.last

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        self.last = sample_discrete_gaussian(sigma, size, self._bits)
        return self.last


DiscreteGaussianNoise = SecureGaussianNoise  # the names the integration may prefer
SeededDiscreteNoise = SeededNoise


# ---------------------------------------------------------------------------------------------------------------
# Exact discrete Gaussian (CKS20: Canonne, Kamath, Steinke 2020, Algorithms 1-3).  See the module docstring.
# ---------------------------------------------------------------------------------------------------------------

INT64_MAX = 2**63 - 1
_BLOCK_WORDS = 8            # one ChaCha20 block = 64 bytes = 8 little-endian 64-bit words
_CHUNK_BLOCKS = 64          # the pure path computes the keystream 4 KiB at a time (a memo; the state is the position)
_ZERO_CHUNK = bytes(64 * _CHUNK_BLOCKS)


class ChaChaBits:
    """The bit stream of a ChaCha20 keystream (RFC 8439, 96-bit nonce 0, block counter from 0).

    Bits are read most significant first from consecutive little-endian 64-bit words of the keystream.  The only
    state is ``key`` and ``pos`` (bits consumed); the cached keystream chunk is a memo of (key, block index).
    The compiled sampler generates the same keystream from the same key and position (fast_dgauss.py).
    """

    __slots__ = ("key", "pos", "_chunk_index", "_chunk")

    def __init__(self, key: bytes, pos: int = 0):
        if type(key) is not bytes or len(key) != 32:
            raise ValueError("a ChaCha20 key is 32 bytes")
        self.key = key
        self.pos = int(pos)
        self._chunk_index = -1
        self._chunk: list[int] = []

    def word(self, index: int) -> int:
        """The index-th 64-bit word of the keystream (little-endian)."""
        ci, wi = divmod(index, _BLOCK_WORDS * _CHUNK_BLOCKS)
        if ci != self._chunk_index:
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
            counter = ci * _CHUNK_BLOCKS
            if counter + _CHUNK_BLOCKS > 2**32:
                raise OverflowError("ChaCha20 block counter exhausted")
            nonce = counter.to_bytes(4, "little") + bytes(12)  # cryptography: 4-byte LE counter || 12-byte nonce
            ks = Cipher(algorithms.ChaCha20(self.key, nonce), None).encryptor().update(_ZERO_CHUNK)
            self._chunk = np.frombuffer(ks, "<u8").tolist()
            self._chunk_index = ci
        return self._chunk[wi]

    def take(self, k: int) -> int:
        """The next k bits as an integer (first bit most significant)."""
        pos = self.pos
        end = pos + k
        w0, off = divmod(pos, 64)
        w1 = (end - 1) // 64
        v = 0
        for w in range(w0, w1 + 1):
            v = (v << 64) | self.word(w)
        self.pos = end
        return (v >> ((w1 + 1) * 64 - end)) & ((1 << k) - 1)

    def randbelow(self, n: int) -> int:
        """Uniform on [0, n) without bias: k = bitlen(n - 1) fresh bits per try, rejected while >= n (n = 1: 0, no
        bits)."""
        if n <= 1:
            if n == 1:
                return 0
            raise ValueError("randbelow needs n >= 1")
        k = (n - 1).bit_length()
        while True:
            v = self.take(k)
            if v < n:
                return v


class RandomBits(Protocol):
    def stream(self) -> ChaChaBits: ...


class SecureRandomBits:
    """Production randomness: every sampling call reads a fresh 256-bit ChaCha20 key from ``os.urandom``; the key and
    the unused keystream are dropped when the call returns (nothing is seeded, stored or reused)."""

    __slots__ = ()

    def stream(self) -> ChaChaBits:
        return ChaChaBits(os.urandom(32))


SECURE_BITS = SecureRandomBits()


class SeededRandomBits:
    """Deterministic bits for tests only: one ChaCha20 stream keyed by SHA-256 of the seed, continued across calls."""

    def __init__(self, seed: int | bytes | str):
        if isinstance(seed, (int, np.integer)):
            seed = int(seed)
            seed = b"i" + seed.to_bytes((seed.bit_length() + 8) // 8, "little", signed=True)
        elif isinstance(seed, str):
            seed = b"s" + seed.encode()
        elif isinstance(seed, bytes):
            seed = b"b" + seed
        else:
            raise TypeError(f"seed must be an int, str or bytes, got {type(seed).__name__}")
        self._stream = ChaChaBits(hashlib.sha256(b"olu-seeded-random-bits\0" + seed).digest())

    def stream(self) -> ChaChaBits:
        return self._stream


def _bern_frac(bits: ChaChaBits, num: int, den: int) -> bool:
    """Bernoulli(num/den), 0 <= num <= den: True iff U < num/den for U = 0.b1 b2 b3 ... uniform on [0, 1), its bits
    read one at a time and compared with the binary digits of num/den (long division: r <- 2r, digit = [r >= den],
    r <- r - digit den) until they first differ (expected 2 bits, at most 2 + bitlen(den) in expectation's tail;
    no bits at num/den = 0 or 1).  Exact: U < p iff at the first differing position U's bit is 0 and p's is 1,
    which happens at position k with probability 2^-k exactly when p's k-th digit is 1, so P(True) = sum of those
    = p.  If p's expansion ends (r = 0) while the bits still agree, U >= p: False."""
    if num <= 0:
        return False
    if num >= den:
        return True
    r = num
    while True:
        r += r
        digit = 0
        if r >= den:
            digit = 1
            r -= den
        b = bits.take(1)
        if b != digit:
            return b < digit
        if r == 0:
            return False


def _bern_exp_series(bits: ChaChaBits, n1: int, d1: int, n2: int, d2: int) -> bool:
    """Bernoulli(exp(-g)) for g = (n1/d1)(n2/d2) in [0, 1] (each factor in [0, 1]): CKS20 Algorithm 1, first branch.

    K = 1; while Bernoulli(g/K): K += 1; return K odd.  P(odd) = sum_k (g^(k-1)/(k-1)! - g^k/k!) over odd k
    = exp(-g).  Bernoulli(g/K) is drawn as the AND of Bernoulli(n1/d1), Bernoulli(n2/d2), Bernoulli(1/K), in that
    order and short-circuited (independent factors: the product of their probabilities), so no denominator larger
    than max(d1, d2, K) is ever formed.
    """
    k = 1
    while _bern_frac(bits, n1, d1) and _bern_frac(bits, n2, d2) and _bern_frac(bits, 1, k):
        k += 1
    return k % 2 == 1


def _bern_exp_product(bits: ChaChaBits, a1: int, b1: int, a2: int, b2: int) -> bool:
    """Bernoulli(exp(-x y)) for x = a1/b1 >= 0, y = a2/b2 >= 0 (CKS20 Algorithm 1, second branch, regrouped).

    With x = xi + xf, y = yi + yf (integer and fractional parts):
        exp(-x y) = exp(-1)^(xi yi) * exp(-yf)^xi * exp(-xf)^yi * exp(-xf yf),
    each factor exp(-g) with g in [0, 1] drawn by ``_bern_exp_series``; the product of independent Bernoullis is a
    Bernoulli of the product, evaluated in this order and stopped at the first 0.  Only a1, b1, a2, b2 and their
    quotients and remainders are ever formed (never x y's own numerator a1 a2 or denominator b1 b2).
    """
    xi, xf = divmod(a1, b1)
    yi, yf = divmod(a2, b2)
    for _ in range(xi):
        for _ in range(yi):
            if not _bern_exp_series(bits, 1, 1, 1, 1):
                return False
    for _ in range(xi):
        if not _bern_exp_series(bits, yf, b2, 1, 1):
            return False
    for _ in range(yi):
        if not _bern_exp_series(bits, xf, b1, 1, 1):
            return False
    return _bern_exp_series(bits, xf, b1, yf, b2)


def _discrete_laplace(bits: ChaChaBits, t: int) -> int:
    """CKS20 Algorithm 2 with s = 1: P(x) proportional to exp(-|x|/t) on Z."""
    while True:
        u = bits.randbelow(t)
        if not _bern_exp_series(bits, u, t, 1, 1):        # Bernoulli(exp(-u/t))
            continue
        v = 0
        while _bern_exp_series(bits, 1, 1, 1, 1):          # V ~ Geometric(1 - exp(-1)) on {0, 1, ...}
            v += 1
        x = u + t * v                                      # exp(-x/t)-distributed on {0, 1, ...}
        neg = bits.take(1)                                 # the sign, Bernoulli(1/2)
        if neg and x == 0:                                 # reject -0 so that 0 is not counted twice
            continue
        return -x if neg else x


def _dgauss_params(sigma) -> tuple[int, int, int]:
    """(N, D, t): sigma^2 = N/D exactly (the float sigma is a dyadic rational) and t = floor(sigma) + 1.

    A float is p/q exactly with q a power of two and gcd(p, q) = 1 (``float.as_integer_ratio``), so N = p^2 and
    D = q^2 are already in lowest terms and floor(sigma) = p // q: integer operations only (~0.3 us; Fraction's
    arithmetic took ~2 us, paid on every forget since sigma changes with each one).  Other numbers (ints,
    Fractions) take the Fraction route, with the same result."""
    if isinstance(sigma, float):
        if 0.0 < sigma < math.inf:
            p, q = sigma.as_integer_ratio()
            return p * p, q * q, p // q + 1
        raise ValueError(f"sigma must be a finite positive number, got {sigma!r}")
    try:
        fs = Fraction(sigma)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"sigma must be a finite positive number, got {sigma!r}") from e
    if not fs > 0:
        raise ValueError(f"sigma must be a finite positive number, got {sigma!r}")
    s2 = fs * fs
    return s2.numerator, s2.denominator, math.floor(fs) + 1


def _dgauss_one(bits: ChaChaBits, n: int, d: int, t: int) -> int:
    """One draw of N_Z(0, N/D): CKS20 Algorithm 3 (rejection from the discrete Laplace of scale t).

    Accept Y with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).  With e = |Y| t D - N this exponent is
    e^2 / (2 N t^2 D) = x y for x = |e| / (t^2 D), y = |e| / (2 N), drawn by ``_bern_exp_product``.
    """
    ttd = t * t * d
    two_n = 2 * n
    while True:
        y = _discrete_laplace(bits, t)
        e = abs(abs(y) * t * d - n)
        if _bern_exp_product(bits, e, ttd, e, two_n):
            return y


def sample_discrete_gaussian_pure(sigma: float, size: int, rand: RandomBits) -> np.ndarray:
    """``sample_discrete_gaussian`` in Python integers only (any sigma; the reference for the compiled path)."""
    n, d, t = _dgauss_params(sigma)
    size = _check_size(size)
    bits = rand.stream()
    out = np.empty(size, dtype=np.int64)
    for i in range(size):
        if not i & 63:
            checkpoint()  # ~50 us a draw: a release of 10^5 coordinates stops within ~3 ms once abandoned
        out[i] = _dgauss_int64(bits, n, d, t)
    return out


def _dgauss_int64(bits: ChaChaBits, n: int, d: int, t: int) -> int:
    """``_dgauss_one``, refusing a draw that does not fit in int64."""
    y = _dgauss_one(bits, n, d, t)
    if not -INT64_MAX <= y <= INT64_MAX:
        raise OverflowError("a discrete Gaussian draw does not fit in int64")
    return y


def _check_size(size) -> int:
    if type(size) is int and size >= 0:
        return size
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be a non-negative integer, got {size!r}")
    return int(size)


def sample_discrete_gaussian(sigma: float, size: int, rand: RandomBits) -> np.ndarray:
    """``size`` independent exact draws from the discrete Gaussian N_Z(0, sigma^2) (int64 array).

    P(k) = exp(-k^2 / (2 sigma^2)) / sum_j exp(-j^2 / (2 sigma^2)) for every integer k, exactly: sigma^2 is the
    exact rational Fraction(sigma)^2 and every decision is an integer comparison of uniform draws from ``rand``.
    Raises ValueError for sigma not finite and > 0, OverflowError if a draw does not fit in int64.
    """
    return _sampler(sigma, size, rand)


_sampler = sample_discrete_gaussian_pure  # replaced by fast_dgauss.sample when fast_dgauss is imported


def use_sampler(sample) -> None:
    """Route ``sample_discrete_gaussian`` through ``sample`` (fast_dgauss.sample registers itself at import: it
    returns the pure path's draws, bit for bit, compiled where it can).  This module never imports fast_dgauss, which
    stands above it."""
    global _sampler
    _sampler = sample
