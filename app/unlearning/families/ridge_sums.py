"""exact_ridge's integer sums: the public fixed-point grid, the exact products of a batch, and the two-word integers
that hold the sums beyond int64 (issue 36 item 5).  The family is in exact_ridge.py.

* **Grid.**  q(x~) = (rint(x 2^kx), 2^kc) and q(t) = rint(y 2^ky) (regression) or t itself (classification, ky = 0);
  kx = bits - e(X), kc = bits - 1, ky = bits - e(Y) with X = x_norm (1 + tol), Y = y_abs (1 + tol) and e(v) the
  exponent with v <= 2^e(v) (math.frexp).  Every coordinate is an integer of magnitude at most 2^bits (+ 1/2).
  ``per_record`` = P bounds what one record adds to any entry of A = sum q(x~) q(x~)^T, B = sum q(t) q(x~)^T and
  C = sum q(t)^2 (the sum GCV needs, kept only by the models that choose l2 so).
* **Exact products.**  A chunk of floor(2^53 / P) rows has every partial sum of its products below 2^53, so float64
  BLAS computes them exactly in any order; each chunk's product is then added to the int64 words.  At p >= 91 a
  chunk is one product (OpenBLAS threads it, and the result is the same exact integers); below, blocks of rows
  small enough for OpenBLAS to stay single-threaded (``block_rows``).  One or two rows: integer outer products,
  straight into the words (a float product, its conversion and the addition were three passes over p^2 entries).
* **Two words.**  Each entry is value = hi 2^62 + lo with lo in [-2^61, 2^61): a canonical form, so two models whose
  sums are equal hold the same words, bit for bit.  While every value fits in lo (the records held times P stay
  below 2^61, a public bound checked before each operation) hi is absent and nothing is normalised: the words are
  today's int64 sums.  Beyond, every chunk's addition is followed by a carry into hi (``normalise``), and hi is
  dropped again once it is all zero.  A state stored with one int64 word per entry (before issue 36) loads as the
  same values (``WideInt.load``: its entries may reach 2^63 - 1, and are normalised).  |hi| stays below 2^53 for
  every model the record cap allows, so ``to_float`` = float(hi) 2^62 + float(lo) is one deterministic function
  of the exact value (at most two roundings; exact below 2^53).
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from ..contract.spec import BOUND_TOLERANCE, ModelSpec

DEFAULT_GRID_BITS = 20
GRID_BITS = (4, 24)
FLOAT_EXACT = 2**53
INT64_MAX = 2**63 - 1
WORD = 62              # value = hi * 2^62 + lo
HALF = 2**61           # lo in [-2^61, 2^61)
LO_LIMIT = 2**61       # the records held times P below this: one word suffices
RECORD_CAP = 2**53 - 1  # the most records a model holds: the largest integer every JSON client reads exactly (less
                        # only where the declared bounds leave the float range: float_cap)
# OpenBLAS multiplies single-threaded when m n k <= 2^18 and with its thread pool above; on a shared or loaded
# machine the pool's threads wait on each other and one request's product (1 000 x 65 at d = 64) took 50-100x
# longer (0.05 s instead of 0.5 ms, 2 cores, load 12).  Products of at most 2^18 / p^2 rows stay below it where
# that is at least 32 rows; beyond (p >= 91) a product of 32 rows is threaded anyway, and one product per chunk
# costs 4-7x less than blocks of 32 rows at p = 1 025 - 2 049 (measured, 2 cores).
BLAS_SINGLE_THREAD = 2**18
MIN_BLOCK_ROWS = 32
FEW_ROWS = 2           # at most this many rows: integer outer products


def block_rows(p: int, outputs: int) -> tuple[int, int]:
    """Rows per product for A (p x p) and for B (outputs x p): below OpenBLAS's threading threshold where that
    leaves at least ``MIN_BLOCK_ROWS`` rows, else a whole chunk (``FLOAT_EXACT`` is the caller's cap)."""
    def rows(cols: int) -> int:
        r = BLAS_SINGLE_THREAD // (p * cols)
        return r if r >= MIN_BLOCK_ROWS else FLOAT_EXACT
    return rows(p), rows(outputs)


LOG_FLOAT_ROOM = 1023.0 * math.log(2.0)  # the largest sums and bounds the solve forms stay below 2^1023


def float_cap(spec: ModelSpec, outputs: int) -> int:
    """The most records for which every number the solve forms stays in the float range (below 2^1023) at the
    declared bounds: the sums n X~^2 (and n Y^2 for GCV's C), n X~ Y sqrt(K), and the weight and score bounds
    n X~ Y sqrt(K) / l2 and n X~^2 Y sqrt(K) / l2 (exact_ridge.check_calibration).  2^53 - 1 for every ordinary
    spec; only bounds near the float range's edge lower it (RidgeGrid keeps at least the one-word cap of before,
    and check_calibration refuses a spec whose sums overflow even there)."""
    x = spec.x_norm * (1.0 + BOUND_TOLERANCE)
    y = 1.0 if spec.n_classes else spec.y_abs * (1.0 + BOUND_TOLERANCE)
    try:
        lx = 0.5 * math.log1p(x * x) if x < 1e150 else math.log(x)  # log X~ = log sqrt(X^2 + 1)
        ly, lk, ll = math.log(y), 0.5 * math.log(outputs), math.log(spec.l2)
    except (ValueError, OverflowError):
        return 0
    worst = max(2 * lx, 2 * ly + 2 * lk, lx + ly + lk, lx + ly + lk - ll, 2 * lx + ly + lk - ll)
    room = LOG_FLOAT_ROOM - worst
    return RECORD_CAP if room >= math.log(RECORD_CAP) else max(0, int(math.exp(room)))


class RidgeGrid:
    """The public fixed-point grid of a spec and the bounds that follow from it (all from the spec alone)."""

    def __init__(self, spec: ModelSpec, bits: int):
        self.bits = bits
        self.dim = spec.dim
        self.classes = int(spec.n_classes)
        x = spec.x_norm * (1.0 + BOUND_TOLERANCE)
        self.x_bound = x
        self.kx = bits - math.frexp(x)[1] if math.isfinite(x) else -(2**20)
        self.kc = bits - 1  # the intercept coordinate 1 is exactly 2^(bits - 1) on its own grid
        self.x_scale = math.ldexp(1.0, self.kx) if math.isfinite(x) else 0.0
        x_tilde = math.sqrt(x * x + 1.0)  # inf for a huge x_norm
        if self.classes:
            self.ky, by = 0, 1.0
            self.y_bound = 1.0
        else:
            y = spec.y_abs * (1.0 + BOUND_TOLERANCE)
            self.y_bound = y
            self.ky = bits - math.frexp(y)[1] if math.isfinite(y) else -(2**20)
            by = 2.0**bits + 0.5
        bx = math.sqrt((2.0**bits + 0.5 * math.sqrt(spec.dim)) ** 2 + 4.0 ** (bits - 1))  # bounds ||q(x~)||
        self.per_record = math.ceil(max(bx * bx, bx * by, by * by))  # the most one record adds to an entry
        # never fewer than one int64 word per entry allowed (the cap before issue 36: the specs accepted then are
        # accepted now, and check_calibration refuses the ones it refused), never more than the float range allows
        self.int64_cap = INT64_MAX // self.per_record
        self.record_cap = min(RECORD_CAP, max(float_cap(spec, self.classes or 1), self.int64_cap))
        self.chunk = max(1, int(FLOAT_EXACT // self.per_record))
        self.x_tilde = x_tilde
        self.outputs = self.classes or 1

    def features(self, X: np.ndarray) -> np.ndarray:
        """q(x~): the records' augmented features on the grid (integer-valued float64, n x (d + 1))."""
        Xq = np.empty((X.shape[0], X.shape[1] + 1))
        Xq[:, :-1] = X
        Xq[:, -1] = 0.0
        # times 2^kx, a normal float for every finite x_norm (kx >= bits - 1024): as exact as ldexp (both round
        # only a subnormal product, identically), and ~10x faster; on the whole contiguous array (faster than
        # the strided feature columns), the intercept column set after
        np.multiply(Xq, self.x_scale, out=Xq)
        np.rint(Xq, out=Xq)
        Xq[:, -1] = math.ldexp(1.0, self.kc)
        return Xq

    def exponents(self, dim: int) -> np.ndarray:
        """Per coordinate of x~, the grid exponent k (q = rint(v 2^k)): kx for the features, kc for the intercept."""
        out = np.full(dim + 1, self.kx, dtype=np.int64)
        out[-1] = self.kc
        return out

    def targets(self, y: np.ndarray) -> np.ndarray:
        """q(t): n x outputs integer-valued float64 (classification: +1 for the class, -1 for the others)."""
        if self.classes:
            T = -np.ones((len(y), self.classes))
            T[np.arange(len(y)), np.asarray(y, dtype=np.int64)] = 1.0
            return T
        return np.rint(np.ldexp(np.asarray(y, dtype=np.float64), self.ky))[:, None]  # ky may pass 1023: ldexp

    # ---- tight bounds of one record on the grid (the private publication's sensitivities) ---------------------
    def feature_norm2(self) -> float:
        """A bound on ||q(x~)||^2 from the declared x_norm: (X 2^kx + sqrt(d)/2)^2 + 4^kc (each coordinate's
        rounding moves it by at most 1/2), rounded up."""
        return math.nextafter((self.x_bound * self.x_scale + 0.5 * math.sqrt(self.dim)) ** 2
                              + 4.0**self.kc, math.inf)

    def target_norm(self) -> float:
        """A bound on ||q(t)||: sqrt(K) for a classifier (t in {-1, +1}^K), Y 2^ky + 1/2 for regression."""
        if self.classes:
            return math.nextafter(math.sqrt(self.classes), math.inf)
        return math.nextafter(self.y_bound * math.ldexp(1.0, self.ky) + 0.5, math.inf)


class WideInt:
    """An int64 array extended to two words (module docstring): value = hi 2^62 + lo, hi None while it is zero."""

    __slots__ = ("lo", "hi")

    def __init__(self, shape: tuple[int, ...]):
        self.lo = np.zeros(shape, dtype=np.int64)
        self.hi: np.ndarray | None = None

    @classmethod
    def load(cls, lo: np.ndarray, hi: np.ndarray | None) -> "WideInt":
        out = cls.__new__(cls)
        out.lo = np.array(lo, dtype=np.int64)
        out.hi = None if hi is None else np.array(hi, dtype=np.int64)
        if out.hi is not None and out.hi.shape != out.lo.shape:
            raise ValueError("stored sums: the two words differ in shape")
        if out.hi is not None or out.lo.size and (out.lo.min() < -HALF or out.lo.max() >= HALF):
            out.normalise()  # a one-word state (entries up to 2^63 - 1) or a stored pair: the canonical form
        return out

    def copy(self) -> "WideInt":
        return WideInt.load(self.lo, self.hi)

    def normalise(self, small: bool = False) -> None:
        """Carry lo into hi so that lo is in [-2^61, 2^61) (exact for every int64 lo: the wrap of lo - c 2^62 is
        the true result modulo 2^64, and that is in [0, 2^62)); hi dropped when it is all zero.  ``small``: the
        caller knows |lo| < 2^62 (a normalised lo plus one chunk's products), so c = (lo + 2^61) >> 62 cannot wrap:
        half the passes over the entries."""
        if small:
            c = (self.lo + HALF) >> WORD
            self.lo -= c << WORD
        else:
            c = self.lo >> WORD
            r = self.lo - (c << WORD)
            up = r >= HALF
            r -= up.astype(np.int64) << WORD
            c += up
            self.lo = r
        hi = c if self.hi is None else self.hi + c
        self.hi = hi if hi.any() else None

    def add_words(self, delta: np.ndarray, sign: int) -> None:
        """lo += sign * delta (int64; the caller keeps |lo| below 2^63 and normalises)."""
        if sign > 0:
            np.add(self.lo, delta, out=self.lo)
        else:
            np.subtract(self.lo, delta, out=self.lo)

    def to_float(self) -> np.ndarray:
        if self.hi is None:
            return self.lo.astype(np.float64)
        return np.ldexp(self.hi.astype(np.float64), WORD) + self.lo.astype(np.float64)

    def exact(self) -> np.ndarray:
        """The values as Python integers (an object array; tests and checks)."""
        lo = self.lo.astype(object)
        return lo if self.hi is None else self.hi.astype(object) * (1 << WORD) + lo

    def state(self, name: str) -> dict[str, np.ndarray]:
        """The stored form: ``name`` is lo (one int64 word per entry, as before issue 36), ``name_hi`` only when
        some value needs it."""
        out = {name: self.lo.copy()}
        if self.hi is not None:
            out[name + "_hi"] = self.hi.copy()
        return out


class Scale:
    """x 2^-(r_i + c_j) elementwise (``np.ldexp`` with those exponents), for the solve's D A D and D B^T: by one
    multiplication with the powers 2^-(r_i + c_j), formed as the outer product of 2^-r and 2^-c (exact), wherever
    every 2^-r_i, 2^-c_j and 2^-(r_i + c_j) is a normal float (exponents in [-1022, 1023]): x 2^e is then the
    correctly rounded exact product either way, the same bits as ldexp, overflow and subnormal results included;
    ~7 ms less at p = 1 025.  Else ldexp itself."""

    def __init__(self, rows: np.ndarray, cols: np.ndarray):
        self.rows, self.cols = (np.asarray(v, dtype=np.int64) for v in (rows, cols))
        sums = (np.zeros(0, np.int64) if self.rows.size == 0 or self.cols.size == 0 else
                np.array([self.rows.min() + self.cols.min(), self.rows.max() + self.cols.max()]))
        self.exact = all(v.size == 0 or (-v.max() >= -1022 and -v.min() <= 1023)
                         for v in (self.rows, self.cols, sums))  # r_i + c_j spans [min r + min c, max r + max c]
        self._powers: np.ndarray | None = None  # the p x p matrix of 2^-(r_i + c_j), kept once formed

    @property
    def exponents(self) -> np.ndarray:
        return -(self.rows[:, None] + self.cols[None, :])

    def apply(self, x: np.ndarray) -> np.ndarray:
        """x 2^-(r_i + c_j), in place on ``x`` (a float64 array the caller owns) where the powers serve."""
        if not self.exact:
            return np.ldexp(x, self.exponents)
        if self._powers is None:  # formed once per model (the grid's exponents never change): ~3 ms at p = 1 025
            self._powers = np.multiply.outer(np.ldexp(1.0, -self.rows), np.ldexp(1.0, -self.cols))
            self._powers.setflags(write=False)
        x *= self._powers
        return x


# ---- A as stored: its upper triangle ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _upper_mask(p: int) -> np.ndarray:
    mask = np.triu(np.ones((p, p), dtype=bool))
    mask.setflags(write=False)
    return mask


def upper_state(A: WideInt, name: str) -> dict[str, np.ndarray] | None:
    """A = sum q q^T is symmetric, exactly (integer sums): its stored form is the upper triangle, row-major, as
    ``name`` (and ``name_hi``): p (p + 1) / 2 entries, half the bytes to pack, seal, write and checkpoint at every
    forget (8 MiB -> 4 MiB at D = 1 025).  Checked, not assumed (~2 ms at p = 1 025): None if A is not symmetric, and
    the caller stores it whole."""
    if A.lo.ndim != 2 or not np.array_equal(A.lo, A.lo.T) or (A.hi is not None and not np.array_equal(A.hi, A.hi.T)):
        return None
    mask = _upper_mask(A.lo.shape[0])
    out = {name: A.lo[mask]}
    if A.hi is not None:
        out[name + "_hi"] = A.hi[mask]
    return out


def from_upper(lo: np.ndarray, hi: np.ndarray | None, p: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The full symmetric words from ``upper_state``'s triangles (ValueError if they are not p (p + 1) / 2 int64)."""
    def full(tri: np.ndarray) -> np.ndarray:
        if tri.dtype != np.int64 or tri.shape != (p * (p + 1) // 2,):
            raise ValueError("stored sums do not match the model's dimension, classes or type")
        out = np.empty((p, p), dtype=np.int64)
        mask = _upper_mask(p)
        out[mask] = tri
        out.T[mask] = tri  # the lower triangle, mirrored
        return out
    return full(lo), None if hi is None else full(hi)


def accumulate(grid: RidgeGrid, X: np.ndarray, y: np.ndarray, sums: Sequence[WideInt], sign: int,
               wide: bool) -> None:
    """Add (sign +1) or subtract (-1) the records' exact products to ``sums`` = (A, B) or (A, B, C), in place.

    ``wide``: some value may leave one word during the operation (the caller's public bound): normalise after each
    chunk; else the int64 words are added as they are (never past 2^61, by that bound)."""
    n = len(y)
    if n == 0:
        return
    dim = X.shape[1]
    p, k = dim + 1, grid.outputs
    A, B = sums[0], sums[1]
    C = sums[2] if len(sums) > 2 else None
    if n <= FEW_ROWS:  # integer outer products, straight into the words (|q_i q_j| <= P < 2^53: exact in int64)
        Xq = grid.features(X).astype(np.int64)
        Tq = grid.targets(y).astype(np.int64)
        for q, t in zip(Xq, Tq):
            A.add_words(np.multiply.outer(q, q), sign)
            B.add_words(np.multiply.outer(t, q), sign)
            if C is not None:
                C.add_words(t * t, sign)
        if wide:
            for s in sums:
                s.normalise(small=True)
        return
    rows_a, rows_b = (max(1, min(grid.chunk, r)) for r in block_rows(p, k))
    for a in range(0, n, grid.chunk):
        Xq = grid.features(X[a : a + grid.chunk])
        Tq = grid.targets(y[a : a + grid.chunk])
        FA, FB = Xq[:rows_a].T @ Xq[:rows_a], Tq[:rows_b].T @ Xq[:rows_b]
        for b in range(rows_a, len(Xq), rows_a):  # float64 sums of integers below 2^53 (one chunk): exact
            FA += Xq[b : b + rows_a].T @ Xq[b : b + rows_a]
        for b in range(rows_b, len(Xq), rows_b):
            FB += Tq[b : b + rows_b].T @ Xq[b : b + rows_b]
        A.add_words(FA.astype(np.int64), sign)
        B.add_words(FB.astype(np.int64), sign)
        if C is not None:
            C.add_words(np.einsum("ij,ij->j", Tq, Tq).astype(np.int64), sign)
        if wide:
            for s in sums:
                s.normalise(small=True)
