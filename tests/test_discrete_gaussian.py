"""The exact discrete Gaussian sampler (app/unlearning/mechanism/noise.py, fast_dgauss.py; CKS20 Algorithms 1-3).

Every statistical test draws from a fixed seed (deterministic) and uses p > 1e-4, so it cannot flake; each has a
negative control showing the same test rejects a slightly wrong distribution.
"""
from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from app.unlearning.mechanism import dgauss_kernel, fast_dgauss
from app.unlearning.mechanism import noise as nz
from app.unlearning.mechanism.noise import (ChaChaBits, SecureGaussianNoise, SecureRandomBits, SeededNoise,
                                            SeededRandomBits, sample_discrete_gaussian, sample_discrete_gaussian_pure)

needs_numba = pytest.mark.skipif(not fast_dgauss.available(), reason="numba not available")
P_MIN = 1e-4


# ---------------------------------------------------------------------------------------------------------------
# exact pmf and binned chi-square
# ---------------------------------------------------------------------------------------------------------------

def _pmf(sigma: float):
    """k, P(k) for |k| <= 40 sigma + 60 (the mass beyond is < exp(-800))."""
    K = int(40 * sigma + 60)
    k = np.arange(-K, K + 1)
    w = np.exp(-(k.astype(np.float64) ** 2) / (2.0 * sigma * sigma))
    return k, w / w.sum()


def _bins(sigma: float, n: int, max_bins: int = 120):
    """Bin edges over the integers: |k| > c pooled into one tail bin (c <= 4 sigma, its expected count >= 20); the
    centre [-c, c] split into <= max_bins intervals.  Returns (edges of the centre intervals, c, probabilities)."""
    k, p = _pmf(sigma)
    c = max(1, int(math.floor(4 * sigma)))
    while c > 1 and p[np.abs(k) > c].sum() * n < 20:
        c -= 1
    width = max(1, int(math.ceil((2 * c + 1) / max_bins)))
    lo = np.arange(-c, c + 1, width)
    hi = np.minimum(lo + width - 1, c)
    probs = [p[(k >= a) & (k <= b)].sum() for a, b in zip(lo, hi)] + [p[np.abs(k) > c].sum()]
    return lo, hi, c, np.array(probs)


def _chisquare_p(draws: np.ndarray, sigma: float) -> float:
    n = len(draws)
    lo, hi, c, probs = _bins(sigma, n)
    obs = [int(np.count_nonzero((draws >= a) & (draws <= b))) for a, b in zip(lo, hi)]
    obs.append(int(np.count_nonzero(np.abs(draws) > c)))
    assert sum(obs) == n  # every draw, tails included, is in a bin
    exp = probs * n
    # pool centre bins with expected count < 5 into the tail bin (small sigma: only the outer integers)
    small = exp[:-1] < 5
    obs = np.array(obs, dtype=np.float64)
    o = np.append(obs[:-1][~small], obs[:-1][small].sum() + obs[-1])
    e = np.append(exp[:-1][~small], exp[:-1][small].sum() + exp[-1])
    assert e[-1] >= 5
    return float(chisquare(o, e * (o.sum() / e.sum())).pvalue)


def _exact_variance(sigma: float) -> float:
    k, p = _pmf(sigma)
    return float((k.astype(np.float64) ** 2 * p).sum())


# ---------------------------------------------------------------------------------------------------------------
# the sampler against its pmf
# ---------------------------------------------------------------------------------------------------------------

@needs_numba
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.75, 50.0, 1e4])
def test_compiled_path_matches_pmf(sigma):
    assert fast_dgauss.params(sigma)[3], "this sigma must run on the compiled path"
    x = sample_discrete_gaussian(sigma, 200_000, SeededRandomBits(f"chi2-fast-{sigma}"))
    assert x.dtype == np.int64
    assert _chisquare_p(x, sigma) > P_MIN


def test_the_compiled_sampler_is_registered_into_noise():
    """noise.py does not import fast_dgauss (it stands above it, issue 22): fast_dgauss registers its ``sample`` at
    import, so sample_discrete_gaussian (and the noise sources that call it) take the compiled route."""
    assert nz._sampler is fast_dgauss.sample


@pytest.mark.parametrize("sigma", [0.5, 3.7, 50.0])
def test_pure_path_matches_pmf(sigma):
    x = sample_discrete_gaussian_pure(sigma, 20_000, SeededRandomBits(f"chi2-pure-{sigma}"))
    assert _chisquare_p(x, sigma) > P_MIN


def test_chisquare_rejects_a_wrong_sigma():
    """Negative control: the same test tells sigma = 1 from 1.05 and 50 from 52."""
    x = sample_discrete_gaussian_pure(1.0, 20_000, SeededRandomBits("chi2-pure-1.0"))
    assert _chisquare_p(x, 1.0) > P_MIN
    assert _chisquare_p(x, 1.05) < P_MIN
    y = sample_discrete_gaussian(50.0, 200_000, SeededRandomBits("chi2-control-50"))
    assert _chisquare_p(y, 50.0) > P_MIN
    assert _chisquare_p(y, 52.0) < P_MIN


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.75, 50.0, 1e6])
def test_mean_zero_and_variance_at_most_sigma_squared(sigma):
    n = 100_000 if fast_dgauss.available() else 5_000
    x = sample_discrete_gaussian(sigma, n, SeededRandomBits(f"moments-{sigma}")).astype(np.float64)
    var = _exact_variance(sigma)
    assert var <= sigma * sigma * (1 + 1e-12)                       # CKS20 Cor. 9: Var <= sigma^2
    assert abs(x.mean()) <= 5 * math.sqrt(var / n)
    # sample variance within 5 standard errors (Var(K^2) <= 3 Var^2 + 1 bounds the fourth moment loosely)
    se = math.sqrt((3 * var * var + 1) / n)
    assert abs(x.var() - var) <= 5 * se
    assert x.var() <= sigma * sigma + 5 * se


def test_large_sigma_and_tails():
    """sigma = 1e9 (compiled) and 2^40 (pure: t^2 D > 2^62): draws of the right scale, symmetric."""
    for sigma, n in ((1e9, 20_000), (2.0**40, 2_000)):
        x = sample_discrete_gaussian(sigma, n, SeededRandomBits(f"large-{sigma}")).astype(np.float64)
        assert abs(x.std() / sigma - 1) < 5 / math.sqrt(n)
        assert abs(x.mean()) < 5 * sigma / math.sqrt(n)
    assert not fast_dgauss.params(2.0**40)[3]


# ---------------------------------------------------------------------------------------------------------------
# compiled == pure on the same bits
# ---------------------------------------------------------------------------------------------------------------

@needs_numba
@pytest.mark.parametrize("sigma", [0.25, 0.5, 1.0, 1 + 2.0**-29, 3.75, 10.0, 50.0, 1234.5, 1e4, 1e6, 2.0**30])
def test_compiled_equals_pure_on_seeded_bits(sigma):
    assert fast_dgauss.params(sigma)[3]
    a_bits, b_bits = SeededRandomBits(f"eq-{sigma}"), SeededRandomBits(f"eq-{sigma}")
    for size in (17, 1, 3000):
        a = sample_discrete_gaussian(sigma, size, a_bits)
        b = sample_discrete_gaussian_pure(sigma, size, b_bits)
        np.testing.assert_array_equal(a, b)
    assert a_bits.stream().pos == b_bits.stream().pos  # the same bits consumed


@needs_numba
def test_fallback_mid_call_gives_the_pure_draws(monkeypatch):
    """A candidate outside the kernel's bounds: the kernel stops and the pure path redoes that draw from the bit
    position where it started, so the draws are those of the pure path."""
    sigma = 10.0
    n, d, t, fits, prm = fast_dgauss.params(sigma)
    tight = prm[:6] + (12,)  # ymax: any |Y| > 12 leaves the kernel
    monkeypatch.setattr(fast_dgauss, "params", lambda s: (n, d, t, True, tight))
    redone = []
    one = nz._dgauss_int64
    monkeypatch.setattr(nz, "_dgauss_int64", lambda *a: redone.append(1) or one(*a))
    a_bits, b_bits = SeededRandomBits("fallback"), SeededRandomBits("fallback")
    a = sample_discrete_gaussian(sigma, 500, a_bits)
    b = sample_discrete_gaussian_pure(sigma, 500, b_bits)
    assert np.abs(b).max() > 12  # the fallback did happen
    np.testing.assert_array_equal(a, b)
    assert a_bits.stream().pos == b_bits.stream().pos
    # only the draws that left the bounds ran on the pure path: the kernel resumed after each
    assert 0 < len(redone) - 500 < 250, len(redone)


def test_long_mantissa_sigma_takes_the_pure_path_and_sigma_for_fast_path():
    assert not fast_dgauss.params(3.7)[3]  # 3.7 = a 52-bit mantissa: 2N > 2^62
    s = fast_dgauss.sigma_for_fast_path(3.7)
    assert s >= 3.7 and (s - 3.7) / 3.7 < 2.0**-28
    assert fast_dgauss.params(s)[3]
    assert fast_dgauss.sigma_for_fast_path(1e6) == 1e6 and fast_dgauss.sigma_for_fast_path(0.5) == 0.5
    rng = np.random.default_rng(2)
    for sigma in np.concatenate([10.0 ** rng.uniform(-8, 30 * math.log10(2), 400), [0.25, 2.0**29, 2.0**30]]):
        s = fast_dgauss.sigma_for_fast_path(float(sigma))
        n, d, t, fits, prm = fast_dgauss.params(s)
        assert s >= sigma and fits, sigma
        assert s - sigma <= max(sigma * 2.0**-28, 2.0**-29)
        if s < 2.0**29:  # room to spare: a Laplace candidate leaves the bounds with probability ~exp(-16) per try
            assert prm[6] >= 16 * t, sigma
    a = sample_discrete_gaussian(3.7, 50, SeededRandomBits("long"))
    np.testing.assert_array_equal(a, sample_discrete_gaussian_pure(3.7, 50, SeededRandomBits("long")))


# ---------------------------------------------------------------------------------------------------------------
# the random bits: ChaCha20 (RFC 8439) in the kernel and in the pure path, unbiased uniforms
# ---------------------------------------------------------------------------------------------------------------

RFC8439_A1_BLOCK0 = bytes.fromhex(  # RFC 8439 A.1 test vector #1: key 0, nonce 0, block counter 0
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586")


def _block_bytes(key: bytes, counter: int) -> bytes:
    k = tuple(np.frombuffer(key, "<u4").astype(np.uint64))
    kernel_block = dgauss_kernel._chacha_block
    return np.array(kernel_block(tuple(np.uint64(v) for v in k), counter), dtype="<u8").tobytes()


def test_chacha_keystream_rfc8439_and_cryptography():
    assert _block_bytes(bytes(32), 0) == RFC8439_A1_BLOCK0  # the kernel's block function (compiled or not)
    bits = ChaChaBits(bytes(32))                             # the pure path's keystream (cryptography)
    assert b"".join(bits.word(i).to_bytes(8, "little") for i in range(8)) == RFC8439_A1_BLOCK0
    rng = np.random.default_rng(5)
    for _ in range(5):
        key = rng.bytes(32)
        counter = int(rng.integers(0, 2**32 - 1))
        bits = ChaChaBits(key)
        words = [bits.word(counter * 8 + j) for j in range(8)]
        assert _block_bytes(key, counter) == np.array(words, dtype="<u8").tobytes()


def test_take_reads_the_keystream_bits_msb_first_across_words():
    key = bytes(range(32))
    bits = ChaChaBits(key)
    stream = "".join(format(bits.word(i), "064b") for i in range(4))
    bits = ChaChaBits(key)
    pos = 0
    for k in (1, 7, 63, 64, 65, 3, 30):
        assert bits.take(k) == int(stream[pos:pos + k], 2)
        pos += k
    assert bits.pos == pos


class ScriptedBits:
    """A bit stream with prescribed values for ``take`` (tests only)."""

    def __init__(self, values):
        self.values = list(values)
        self.pos = 0

    def take(self, k):
        v = self.values.pop(0)
        assert 0 <= v < 2**k
        self.pos += k
        return v

    randbelow = ChaChaBits.randbelow


def test_randbelow_rejects_instead_of_reducing_modulo():
    # n = 5 needs 3 bits; 5, 6, 7 are rejected (a modulo would map them to 0, 1, 2)
    assert ScriptedBits([5, 6, 7, 4]).randbelow(5) == 4
    s = ScriptedBits([])
    assert s.randbelow(1) == 0 and s.pos == 0


def test_bernoulli_decisions_are_exact_integer_comparisons():
    """Bernoulli(num/den) with num/den = (2^60 + 1)/2^61 = 0.1 0^59 1 in binary: a uniform U whose first 61 bits
    are 1 0^60 is below num/den (True), although U >= 0.5 == float(num/den), so a float comparison would say False;
    bits 1 0^59 1 agree with every digit of num/den, whose expansion then ends: U >= num/den (False)."""
    num, den = 2**60 + 1, 2**61
    assert float(num / den) == 0.5  # what floating point would compare against
    below = ScriptedBits([1] + [0] * 60)
    assert nz._bern_frac(below, num, den) is True and below.pos == 61 and not below.values
    equal = ScriptedBits([1] + [0] * 59 + [1])
    assert nz._bern_frac(equal, num, den) is False and equal.pos == 61 and not equal.values
    # the first differing bit decides, and no further bit is read
    assert nz._bern_frac(ScriptedBits([0]), num, den) is True
    assert nz._bern_frac(ScriptedBits([1, 1]), num, den) is False
    assert nz._bern_frac(ScriptedBits([]), 0, 5) is False and nz._bern_frac(ScriptedBits([]), 5, 5) is True


def test_bernoulli_reads_two_bits_on_average():
    """The lazy comparison reads 2 bits per Bernoulli on average (1 + a geometric), however large den is."""
    bits = SeededRandomBits("lazy-bits").stream()
    n, num, den = 20_000, 2**61 // 3, 2**61 + 7
    hits = sum(nz._bern_frac(bits, num, den) for _ in range(n))
    assert binomtest(hits, n, num / den).pvalue > P_MIN
    assert abs(bits.pos / n - 2.0) < 0.05


@pytest.mark.parametrize("sigma", [0.1, 1 + 2.0**-52, 3.7, 2.0**31 - 0.5, 1e-3, 12345.678])
def test_sigma_squared_is_the_exact_rational(sigma):
    n, d, t = nz._dgauss_params(sigma)
    assert Fraction(n, d) == Fraction(sigma) ** 2
    assert t == math.floor(Fraction(sigma)) + 1
    # sigma^2 of these floats is not a float: the sampler uses the rational, not sigma * sigma
    assert Fraction(sigma * sigma) != Fraction(n, d)


@pytest.mark.parametrize("a1,b1,a2,b2", [(1, 3, 1, 1), (1, 1, 1, 1), (5, 2, 1, 1), (7, 4, 9, 5), (3, 1, 2, 3),
                                         (0, 1, 5, 1), (123457, 100000, 31, 17)])
def test_bernoulli_exp_minus_gamma(a1, b1, a2, b2):
    """CKS20 Algorithm 1 (as regrouped in noise._bern_exp_product): P(True) = exp(-a1 a2 / (b1 b2))."""
    gamma = Fraction(a1 * a2, b1 * b2)
    p = math.exp(-float(gamma))
    bits = SeededRandomBits(f"bern-{a1}-{b1}-{a2}-{b2}").stream()
    n = 20_000
    hits = sum(nz._bern_exp_product(bits, a1, b1, a2, b2) for _ in range(n))
    if gamma == 0:
        assert hits == n
        return
    assert binomtest(hits, n, p).pvalue > P_MIN
    # negative control: the same count is not consistent with exp(-1.1 gamma)
    assert binomtest(hits, n, math.exp(-1.1 * float(gamma))).pvalue < P_MIN


def test_bernoulli_exp_series_branch():
    bits = SeededRandomBits("series").stream()
    n = 20_000
    for n1, d1, n2, d2 in ((1, 2, 1, 1), (2, 3, 3, 4), (1, 1, 1, 1)):
        g = n1 * n2 / (d1 * d2)
        hits = sum(nz._bern_exp_series(bits, n1, d1, n2, d2) for _ in range(n))
        assert binomtest(hits, n, math.exp(-g)).pvalue > P_MIN


# ---------------------------------------------------------------------------------------------------------------
# the noise sources and bad input
# ---------------------------------------------------------------------------------------------------------------

def test_seeded_noise_is_reproducible_and_records_last():
    a, b = SeededNoise(3), SeededNoise(3)
    x = a.discrete_gaussian(7.5, 17)
    assert a.last is x and x.dtype == np.int64 and x.shape == (17,)
    b.standard_normal(4)  # the Gaussian stream does not shift the discrete one
    np.testing.assert_array_equal(b.discrete_gaussian(7.5, 17), x)
    assert not np.array_equal(a.discrete_gaussian(7.5, 17), x)
    g = a.standard_normal(3)
    assert a.last is g


def test_seeded_bits_seeds():
    first = [SeededRandomBits(s).stream().take(64) for s in (1, np.int64(1), "1", b"1", 2, -1, 10**30)]
    assert first[0] == first[1]                       # numpy integers are integers
    assert len(set(first[1:])) == len(first) - 1      # 1, "1" and b"1" are different seeds
    with pytest.raises(TypeError):
        SeededRandomBits(1.5)


def test_recording_noise_in_d2d_replay_records_discrete_draws():
    from app.unlearning.verification.d2d_replay import RecordingNoise
    r = RecordingNoise(SeededNoise(1))
    z = r.discrete_gaussian(2.0, 5)
    assert r.last is z and z.dtype == np.int64


def test_secure_noise_fresh_each_call():
    s = SecureGaussianNoise()
    draws = [s.discrete_gaussian(1e6, 17) for _ in range(3)]
    assert all(d.dtype == np.int64 and d.shape == (17,) for d in draws)
    assert not np.array_equal(draws[0], draws[1])
    assert SecureRandomBits().stream().key != SecureRandomBits().stream().key
    assert s.standard_normal(17).shape == (17,)  # the Gaussian API still works


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("nan"), float("inf"), "x", None])
def test_bad_sigma_is_a_value_error(sigma):
    with pytest.raises(ValueError):
        sample_discrete_gaussian(sigma, 3, SeededRandomBits(0))
    with pytest.raises(ValueError):
        sample_discrete_gaussian_pure(sigma, 3, SeededRandomBits(0))


@pytest.mark.parametrize("size", [-1, 2.5, True, "3"])
def test_bad_size_is_a_value_error(size):
    with pytest.raises(ValueError):
        sample_discrete_gaussian(1.0, size, SeededRandomBits(0))


def test_size_zero_and_overflow():
    assert sample_discrete_gaussian(1.0, 0, SeededRandomBits(0)).shape == (0,)
    with pytest.raises(OverflowError):
        sample_discrete_gaussian(1e30, 4, SeededRandomBits(0))


def test_pure_path_when_compiled_path_is_off():
    previous = fast_dgauss.set_enabled(False)
    try:
        a = sample_discrete_gaussian(10.0, 20, SeededRandomBits("off"))
    finally:
        fast_dgauss.set_enabled(previous)
    np.testing.assert_array_equal(a, sample_discrete_gaussian_pure(10.0, 20, SeededRandomBits("off")))


def test_secure_bits_use_os_urandom(monkeypatch):
    calls = []
    real = os.urandom

    def spy(n):
        calls.append(n)
        return real(n)

    monkeypatch.setattr(nz.os, "urandom", spy)
    SecureGaussianNoise().discrete_gaussian(3.0, 5)
    assert calls == [32]


@needs_numba
def test_fallback_with_production_bits(monkeypatch):
    """The os.urandom-keyed path falls back the same way (its stream is rebuilt from the key and position)."""
    sigma = 10.0
    n, d, t, fits, prm = fast_dgauss.params(sigma)
    tight = prm[:6] + (12,)
    monkeypatch.setattr(fast_dgauss, "params", lambda s: (n, d, t, True, tight))
    x = np.concatenate([sample_discrete_gaussian(sigma, 50, SecureRandomBits()) for _ in range(20)])
    assert x.dtype == np.int64 and np.abs(x).max() > 12
