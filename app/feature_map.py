"""Public feature maps (issue 39): a model declared with ``feature_map`` learns, forgets and predicts on phi(x), a
fixed nonlinear map of its raw rows, so a linear family (exact_ridge above all) fits curved boundaries.

Nothing in a map depends on data: its centres (or frequencies) are drawn from N(0, I) by a public seed, its
bandwidth ``gamma`` and the input scaling are declared in the spec, and no centre, scale or bandwidth is ever fitted.
The map is a pure function of (the stored map spec, one row), computed the same way at learn, forget and predict,
so the service applies it where rows are encoded for the engine (``encode_rows``) and the engine only ever sees
phi(x) (app/unlearning stays a linear-model engine with dim = D and x_norm = the map's bound).

* **Input scaling** (public, declared): z = clip((x - centre) / scale, -clip, clip) per feature, with ``centre``
  and ``scale`` per feature (default 0 and 1: rows already standardised) or ``ranges`` [lo, hi] per feature
  (centre = (lo + hi) / 2, scale = (hi - lo) / 2, so the range maps onto [-1, 1]); ``clip`` defaults to 4
  standardised units (1 with ranges).  Any finite raw row is accepted: what lies outside is clipped.
* **rbf** (Nystroem with public landmarks): centres c_1..c_C ~ N(0, I_d) in standardised units, k(z, c) =
  exp(-gamma ||z - c||^2) (gamma default 1/d), and phi(z) = k(z, C) L^-T with L the Cholesky factor of
  K_CC + eps I (eps = C 2^-40, raised x16 until the factorisation succeeds).  phi(z) . phi(z') = k_z^T (K_CC +
  eps I)^-1 k_z', the Nystroem approximation of k; the symmetric K_CC^-1/2 gives the same inner products (the two
  maps differ by a rotation, which ridge, OGD on a ball and isotropic noise do not see) at 10x the precompute.
  ||phi(z)||^2 = k_z^T (K_CC + eps I)^-1 k_z <= k(z, z) = 1: the squared norm of a projection in the kernel's
  feature space.
* **rff** (random Fourier features, Rahimi & Recht 2007): m = C / 2 frequencies w_j ~ N(0, 2 gamma I_d) and
  phi(z) = (cos(w_j . z), sin(w_j . z))_j / sqrt(m), so ||phi(z)|| = 1 and phi(z) . phi(z') approximates k.
* **The bound.**  Every row is finally projected onto the ball of radius ``bound`` = min(1, bounds.x_norm), less
  2^-40 of it (``app.features.clip_rows``), so floating-point round-off never breaks it, however the norm is
  summed: every mapped feature lies in [-1, 1] and every guarantee of the family is computed with x_norm = that
  bound.

**Determinism.**  exact_ridge with client-resent features recomputes phi(x) at forget, and its integer sums cancel
only if the quantised phi(x) is bit for bit the one learned.  So: the centres come from numpy's legacy
``RandomState`` (its streams are frozen across numpy versions, unlike ``Generator``); the precomputation runs on
one BLAS thread (LAPACK's Cholesky differs in its last bits between thread counts) and is cached per process;
every product is a BLAS call of one fixed shape, ``BLOCK`` rows (the last block padded with zeros): OpenBLAS picks
its kernel by the shape (gemv for one row, "small matrix" kernels below a size, blocked gemm above: each orders its
sums differently), and within one shape a row's result does not depend on its position nor on the other rows (the
library splits a product by rows and columns, never along the summed dimension; tests/test_feature_map.py checks
batch splits, positions and a rebuilt precomputation bit for bit).
Should another machine or BLAS build compute a different last bit, the keyed check code the service keeps per
record is computed on phi(x) itself (what the sums hold), so the forget is refused (422 example-mismatch) and
never corrupts the sums.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.linalg import lapack
from threadpoolctl import ThreadpoolController

from .features import FeatureError, clip_rows

KINDS = ("rbf", "rff")
DEFAULT_CENTRES = 1024
DEFAULT_SEED = 0x4F4C55  # public ("OLU"), as the hashing seed of app/features.py
DEFAULT_CLIP = 4.0       # standardised units (1 with ranges: the declared range itself)
GAMMA_RANGE = (1e-12, 1e12)
CLIP_RANGE = (1e-6, 1e6)
MAX_CENTRES = 65536      # the schema's bound; the work and memory budget refuses far below it
MAX_SEED = 2**32 - 1     # RandomState's seed range
JITTER = 2.0**-40        # eps = C JITTER on the Cholesky's diagonal (K_CC has ones there)
BLOCK = 32               # rows of every product: one fixed shape per map (see "Determinism")
MARGIN = 1.0 - 2.0**-40  # rows are projected onto bound * MARGIN: below the bound by any way of summing the norm
# work units (app/unlearning/maths/work_budget.py: ~1 ns of one core): a flop in BLAS-3, one exp / cos / sin
DENSE_FLOP, ELEMENT, CALL = 0.1, 10.0, 5_000.0


class FeatureMapError(ValueError):
    """A map spec refused at creation; ``field`` is its path in the creation payload (e.g. ``feature_map.scale``),
    ``accepted`` the accepted range of that field with every other field as given, when one exists."""

    def __init__(self, message: str, field: str, accepted: tuple[float, float] | None = None):
        super().__init__(message)
        self.field, self.accepted = field, accepted


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _vector(raw: Any, dim: int, field: str, positive: bool = False) -> list[float]:
    if not isinstance(raw, (list, tuple)) or len(raw) != dim:
        raise FeatureMapError(f"{field} must have one value per input feature ({dim} values: the model's dim)", field)
    out = []
    for v in raw:
        if not _number(v) or (positive and not v >= np.finfo(np.float64).tiny):
            raise FeatureMapError(f"{field} values must be finite{' positive normal' if positive else ''} numbers",
                                  field)
        out.append(float(v))
    return out


def normalize_map(raw: Mapping[str, Any], dim: int, x_norm: float) -> dict[str, Any]:
    """The stored (and served) map with every default filled in; refuses what cannot be served (``FeatureMapError``
    naming the field).  ``dim`` is the model's declared dim (the raw rows' length), ``x_norm`` its declared bound."""
    raw = {k: v for k, v in raw.items() if v is not None}
    kind = raw.get("kind")
    if kind not in KINDS:
        raise FeatureMapError(f"kind must be one of {', '.join(KINDS)}", "feature_map.kind")
    C = raw.get("centres", DEFAULT_CENTRES)
    if isinstance(C, float) and C.is_integer():
        C = int(C)
    lowest = 2 if kind == "rff" else 1
    if isinstance(C, bool) or not isinstance(C, int) or not lowest <= C <= MAX_CENTRES or (kind == "rff" and C % 2):
        raise FeatureMapError(f"centres must be an integer in [{lowest}, {MAX_CENTRES}]"
                              + (" and even (a cosine and a sine per frequency)" if kind == "rff" else ""),
                              "feature_map.centres", (float(lowest), float(MAX_CENTRES)))
    gamma = raw.get("gamma", 1.0 / dim)
    if not _number(gamma) or not GAMMA_RANGE[0] <= gamma <= GAMMA_RANGE[1]:
        raise FeatureMapError(f"gamma must be a number in [{GAMMA_RANGE[0]:g}, {GAMMA_RANGE[1]:g}]",
                              "feature_map.gamma", GAMMA_RANGE)
    seed = raw.get("seed", DEFAULT_SEED)
    if isinstance(seed, float) and seed.is_integer():
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise FeatureMapError(f"seed must be an integer in [0, {MAX_SEED}]", "feature_map.seed", (0.0, float(MAX_SEED)))
    if raw.get("ranges") is not None:
        if raw.get("centre") is not None or raw.get("scale") is not None:
            raise FeatureMapError("declare either ranges or centre and scale, not both", "feature_map.ranges")
        rngs = raw["ranges"]
        if not isinstance(rngs, (list, tuple)) or len(rngs) != dim:
            raise FeatureMapError(f"feature_map.ranges must have one [lo, hi] per input feature ({dim}: the model's "
                                  "dim)", "feature_map.ranges")
        centre, scale = [], []
        for r in rngs:
            if (not isinstance(r, (list, tuple)) or len(r) != 2 or not all(_number(v) for v in r)
                    or not r[0] < r[1] or not math.isfinite(float(r[1]) - float(r[0]))):
                raise FeatureMapError("each range is [lo, hi], finite numbers with lo < hi (and hi - lo finite)",
                                      "feature_map.ranges")
            lo, hi = float(r[0]), float(r[1])
            centre.append(lo + 0.5 * (hi - lo))
            scale.append(0.5 * (hi - lo))
        if not all(s >= np.finfo(np.float64).tiny for s in scale):
            raise FeatureMapError("a range is too narrow (its half-width is not a normal number)", "feature_map.ranges")
        default_clip = 1.0
    else:
        centre = _vector(raw.get("centre", [0.0] * dim), dim, "feature_map.centre")
        scale = _vector(raw.get("scale", [1.0] * dim), dim, "feature_map.scale", positive=True)
        default_clip = DEFAULT_CLIP
    clip = raw.get("clip", default_clip)
    if not _number(clip) or not CLIP_RANGE[0] <= clip <= CLIP_RANGE[1]:
        raise FeatureMapError(f"clip must be a number in [{CLIP_RANGE[0]:g}, {CLIP_RANGE[1]:g}]", "feature_map.clip",
                              CLIP_RANGE)
    return {"kind": kind, "centres": C, "gamma": float(gamma), "seed": seed, "centre": centre, "scale": scale,
            "clip": float(clip), "input_dim": int(dim), "dim": C, "bound": float(min(1.0, x_norm))}


# ---- the work and memory of a map (app/unlearning/maths/work_budget.py units) ---------------------------------------
def precompute_work(fm: Mapping[str, Any]) -> float:
    """Drawing the centres, forming K_CC and its Cholesky factor and inverse (rbf); drawing the frequencies (rff)."""
    C, d = fm["centres"], fm["input_dim"]
    if fm["kind"] == "rff":
        return C * d * ELEMENT
    return C * d * ELEMENT + 2.0 * C * C * d * DENSE_FLOP + C * C * ELEMENT + (2.0 / 3.0) * C**3 * DENSE_FLOP


def rows_work(fm: Mapping[str, Any], n: int) -> float:
    """Mapping n rows: scaling, the kernel (or phase) product, exp (or cos and sin), the product with L^-T."""
    C, d = fm["centres"], fm["input_dim"]
    per = 4.0 * d + (2.0 * C * d + 2.0 * C * C) * DENSE_FLOP + 2.0 * C * ELEMENT
    if fm["kind"] == "rff":
        per = 4.0 * d + C * d * DENSE_FLOP + C * ELEMENT
    return math.ceil(max(n, 1) / BLOCK) * (BLOCK * per + CALL)


def memory_bytes(fm: Mapping[str, Any]) -> float:
    """The largest array a map holds or forms: L^-T (C x C, rbf), the centres, one block of rows."""
    C, d = fm["centres"], fm["input_dim"]
    return 8.0 * max(C * C if fm["kind"] == "rbf" else 0, C * d, BLOCK * max(C, d))


# ---- the map itself ---------------------------------------------------------------------------------------------------
class _OneBlasThread:
    """A context in which BLAS and LAPACK run on one thread (threadpoolctl), for results that do not depend on the
    machine's thread count.  The limit is process-wide: the contexts of concurrent requests are counted, and the
    first sets it, the last restores it (nested threadpoolctl contexts restoring in another order than they began
    would otherwise leave a request computing on the old thread count)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._limiter = None
        self._controller: ThreadpoolController | None = None

    def __enter__(self):
        with self._lock:
            if self._depth == 0:
                if self._controller is None:
                    self._controller = ThreadpoolController()
                self._limiter = self._controller.limit(limits=1, user_api="blas")
            self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._limiter is not None:
                self._limiter.restore_original_limits()
                self._limiter = None

    def single(self) -> bool:
        """Whether every BLAS library of the process runs on one thread now."""
        info = (self._controller or ThreadpoolController()).select(user_api="blas").info()
        return all(lib.get("num_threads") == 1 for lib in info)


_ONE_THREAD = _OneBlasThread()


def _one_blas_thread() -> _OneBlasThread:
    return _ONE_THREAD


class _Prepared:
    """What a map computes once per process: the centres (or frequencies) and, for rbf, L^-T."""

    def __init__(self, fm: Mapping[str, Any]):
        C, d, gamma = fm["centres"], fm["input_dim"], fm["gamma"]
        rng = np.random.RandomState(fm["seed"])  # frozen stream (NEP 19): the same centres on every numpy
        self.kind = fm["kind"]
        if self.kind == "rff":
            m = C // 2
            self.W = rng.standard_normal((m, d)) * math.sqrt(2.0 * gamma)
            self.scale = 1.0 / math.sqrt(m)
            self.nbytes = self.W.nbytes
            return
        self.centres = rng.standard_normal((C, d))
        self.c2 = np.einsum("ij,ij->i", self.centres, self.centres)
        self.gamma = gamma
        for _ in range(3):  # LAPACK's Cholesky differs in its last bits between thread counts: on one thread, checked
            with _one_blas_thread() as one:  # after (another library in the process may have changed the limit)
                Linv = self._factor(C, gamma)
                if one.single():
                    break
        self.M = np.ascontiguousarray(Linv.T)  # phi = k(z, C) L^-T
        self.nbytes = self.M.nbytes + self.centres.nbytes

    def _factor(self, C: int, gamma: float) -> np.ndarray:
        """L^-1 for L the Cholesky factor of K_CC + eps I (eps raised x16 until the factorisation succeeds)."""
        K = _kernel(self.centres, self.c2, self.centres, gamma)
        eps = C * JITTER
        for _ in range(12):
            L, info = lapack.dpotrf(K + eps * np.eye(C), lower=1, clean=1)
            if info == 0:
                break
            eps *= 16.0
        else:  # pragma: no cover - K_CC + eps I with eps >= 2^8 C is positive definite in floating point
            raise FeatureMapError("the centres' kernel matrix cannot be factorised", "feature_map.gamma")
        Linv, info = lapack.dtrtri(L, lower=1)
        if info != 0 or not np.all(np.isfinite(Linv)):  # pragma: no cover
            raise FeatureMapError("the centres' kernel matrix cannot be inverted", "feature_map.gamma")
        return Linv

    def apply(self, Z: np.ndarray) -> np.ndarray:
        """phi of standardised rows Z (``BLOCK`` rows: every product has the map's one shape)."""
        if self.kind == "rff":
            P = Z @ self.W.T
            return np.concatenate([np.cos(P), np.sin(P)], axis=1) * self.scale
        return _kernel(Z, np.einsum("ij,ij->i", Z, Z), self.centres, self.gamma, self.c2) @ self.M


def _kernel(A: np.ndarray, a2: np.ndarray, B: np.ndarray, gamma: float, b2: np.ndarray | None = None) -> np.ndarray:
    """exp(-gamma ||a_i - b_j||^2), the squared distances as ||a||^2 + ||b||^2 - 2 a.b (one product) clipped at 0."""
    b2 = a2 if b2 is None else b2
    D2 = A @ B.T
    D2 *= -2.0
    D2 += a2[:, None]
    D2 += b2[None, :]
    np.maximum(D2, 0.0, out=D2)
    D2 *= -gamma
    return np.exp(D2, out=D2)


CACHE_BYTES = 256 << 20  # per process: 8 maps of 2 048 centres
_cache: OrderedDict[tuple, _Prepared] = OrderedDict()
_cache_lock = threading.Lock()
_build_locks: dict[tuple, threading.Lock] = {}


def _key(fm: Mapping[str, Any]) -> tuple:
    return (fm["kind"], fm["centres"], fm["gamma"], fm["seed"], fm["input_dim"])


def prepared(fm: Mapping[str, Any]) -> _Prepared:
    """The map's precomputation, built once per process (one build at a time per map) and cached (LRU by bytes)."""
    key = _key(fm)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        lock = _build_locks.setdefault(key, threading.Lock())
    with lock:
        with _cache_lock:
            hit = _cache.get(key)
        if hit is not None:
            return hit
        built = _Prepared(fm)
        with _cache_lock:
            _cache[key] = built
            total = sum(p.nbytes for p in _cache.values())
            while total > CACHE_BYTES and len(_cache) > 1:
                _, old = _cache.popitem(last=False)
                total -= old.nbytes
            _build_locks.pop(key, None)
        return built


def map_rows(fm: Mapping[str, Any], X: np.ndarray, fixed: bool = True) -> np.ndarray:
    """phi of raw rows X (n x input_dim, finite): scaled and clipped, mapped, projected onto the ball of radius
    ``fm["bound"]``.  ``fixed`` (learn and forget): row i's result is the same whatever the other rows (see the
    module docstring), every product padded to ``BLOCK`` rows.  Not ``fixed`` (predict and evaluate, whose phi is
    never summed nor checked against a record's check code): the last block is not padded, so a 1-row predict
    forms one 1-row product instead of a 32-row one (at 1 024 centres the product is ~97 % of the map's work); its
    phi may then differ from the padded one in the last bits (round-off of another summation order, ~1e-16
    relative), which can change an answer only at an exact tie between two classes' scores."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    prep = prepared(fm)
    centre = np.asarray(fm["centre"], dtype=np.float64)
    scale = np.asarray(fm["scale"], dtype=np.float64)
    out = np.empty((n, fm["dim"]))
    Z = np.zeros((BLOCK, X.shape[1]))
    with np.errstate(over="ignore"), _one_blas_thread():
        for a in range(0, n, BLOCK):
            m = min(BLOCK, n - a)
            block = Z if fixed else Z[:m]
            Z[m:] = 0.0  # the last block's padding
            np.subtract(X[a : a + m], centre, out=Z[:m])
            Z[:m] /= scale  # a huge x may overflow to +-inf here: clipped next
            np.clip(block, -fm["clip"], fm["clip"], out=block)
            out[a : a + m] = prep.apply(block)[:m]
    return clip_rows(out, fm["bound"] * MARGIN)


# ---- the service's entry point --------------------------------------------------------------------------------------
def check_rows(fm: Mapping[str, Any], X: Any) -> np.ndarray:
    """Raw rows of a request as a float array: each of the model's declared dim finite values, else ``FeatureError``
    with code invalid-dimension / out-of-bounds-input naming the row (``index``)."""
    d = fm["input_dim"]
    if isinstance(X, np.ndarray) and X.ndim == 2:
        if X.shape[1] != d:
            raise FeatureError(f"each x must have {d} values (the model's dim)", "x", "invalid-dimension", 0)
        A = np.asarray(X, dtype=np.float64)
    else:
        bad = next((i for i, x in enumerate(X) if len(x) != d), None)
        if bad is not None:
            raise FeatureError(f"each x must have {d} values (the model's dim)", "x", "invalid-dimension", bad)
        A = np.asarray(X, dtype=np.float64).reshape(len(X), d)
    finite = np.isfinite(A).all(axis=1)
    if not finite.all():
        i = int(np.argmin(finite))
        raise FeatureError("x must hold finite numbers", "x", "out-of-bounds-input", i)
    return A


def encode(fm: Mapping[str, Any] | None, X: Any, fixed: bool = True) -> Any:
    """The rows the engine takes: ``X`` itself for a model without a map, else phi of the checked raw rows, at
    most ``fm["max_rows"]`` of them (413 batch-too-large through ``FeatureError``, code batch-too-large).
    ``fixed``: every product of the map's one shape (``map_rows``): learn and forget; predict may pass False."""
    if fm is None:
        return X
    check_count(fm, len(X))
    return map_rows(fm, check_rows(fm, X), fixed)


def check_count(fm: Mapping[str, Any] | None, n: int) -> None:
    """At most ``fm["max_rows"]`` rows in one request (FeatureError code batch-too-large, answered 413); the caller
    that encodes a request chunk by chunk checks its whole count first."""
    most = None if fm is None else fm.get("max_rows")
    if most is not None and n > most:
        raise FeatureError(f"This model maps at most {most} rows per request (its feature map's work budget, "
                           "feature_map.max_rows); send them in several requests.", "x", "batch-too-large", None)


def map_summary(fm: Mapping[str, Any] | None) -> str | None:
    """The words the guarantee adds for a model with a map (receipts and the model view)."""
    if fm is None:
        return None
    what = (f"{fm['centres']} Nystroem centres drawn from N(0, I) with seed {fm['seed']}" if fm["kind"] == "rbf"
            else f"{fm['centres'] // 2} random Fourier frequencies drawn with seed {fm['seed']}")
    return (f"The model learns on a public feature map ({fm['kind']}: {what}, gamma {fm['gamma']:.6g}, declared input "
            f"scaling clipped at {fm['clip']:g}): nothing in the map depends on data, and the guarantee holds for "
            f"the mapped vectors, whose norm is at most {fm['bound']:g}.")
