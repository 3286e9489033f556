"""Feature dictionaries -> dense vectors: the hashing featurizer of models declared with ``features: {"type":
"hashed", ...}``.

A pure, deterministic function of (the model's stored feature spec, one dictionary, the declared ``x_norm``):
no state, no statistics of the data, nothing stored.  The service calls it wherever a dictionary enters (learn,
predict, client-sent deletion features), so learning, forgetting and replay see the very same dense vector; the
engine only ever sees that vector (app/unlearning stays numpy).

The encoding (the "hashing trick" of Weinberger et al. 2009, as in Vowpal Wabbit and scikit-learn's
FeatureHasher):

- a token is hashed with MurmurHash3 x64 128-bit (``mmh3``) under the fixed public seed ``SEED``; its low 64 bits
  modulo ``dim`` give the bucket, its top bit the sign (+1 or -1), so collisions cancel in expectation;
- a categorical field ``f`` with string value ``v`` is the token ``f NUL v`` with value 1; a list of strings adds
  one such token per item (a multiset: an item given twice counts twice);
- a numeric field ``f`` declared with range [lo, hi] is the token ``f`` (no NUL: a field name never holds one, so
  numeric and categorical tokens never coincide) with value 2 (v - lo) / (hi - lo) - 1, in [-1, 1]; a value
  outside [lo, hi] is refused (``out_of_range: "refuse"``, the default) or clipped to it (``"clip"``);
- a field the spec does not declare is refused (``unknown_fields: "refuse"``, the default) or ignored
  (``"ignore"``); a declared field that is absent (or null) contributes nothing;
- the sum is then scaled down, if needed, to the declared L2 bound ``x_norm`` (never scaled up), so every vector
  the engine receives satisfies the bound its certificates assume.

Fields are visited in sorted order and list items sorted, so the vector does not depend on the order of the
dictionary's keys or of a list's items (floating-point sums included).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import mmh3
import numpy as np
from scipy.sparse import csr_array  # imported with the app: its objects are frozen at start-up (gc_pauses.py)

HASH = "murmurhash3_x64_128"
SEED = 0x4F4C55  # fixed and public ("OLU"): the same token lands in the same bucket on every server, forever
_LOW64 = (1 << 64) - 1
MAX_STRING = 1024      # longest categorical value (characters)
MAX_LIST = 1000        # most items in one list field
MAX_FIELDS = 1000      # most declared fields, and most fields in one dictionary
MAX_FIELD_NAME = 128   # longest field name
OUT_OF_RANGE = ("refuse", "clip")
UNKNOWN_FIELDS = ("refuse", "ignore")


class FeatureError(ValueError):
    """A dictionary the spec refuses: ``field`` names the field, ``code`` the problem type, ``index`` the example."""

    def __init__(self, message: str, field: str | None, code: str = "invalid-features", index: int | None = None):
        super().__init__(message)
        self.field, self.code, self.index = field, code, index


class FeatureSpecError(ValueError):
    """A feature spec refused at model creation; ``field`` is its path inside the spec (e.g. ``numeric.age``)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def normalize_spec(raw: Mapping[str, Any], dim: int) -> dict[str, Any]:
    """The stored (and served) feature spec with every default filled in; refuses what cannot be encoded.

    ``raw`` is the creation payload's ``features`` (its types already checked by the API schema); ``dim`` the
    model's dimension, which the hashed dimension must equal."""
    if raw.get("type") != "hashed":
        raise FeatureSpecError("type must be 'hashed'", "type")
    D = raw.get("dim", dim)
    if not isinstance(D, int) or isinstance(D, bool) or D < 1:
        raise FeatureSpecError("dim must be a positive integer", "dim")
    if D != dim:
        raise FeatureSpecError(f"dim ({D}) must equal the model's dim ({dim}): the hashed vector is the model's "
                               "feature vector", "dim")
    numeric: dict[str, list[float]] = {}
    for name, rng in (raw.get("numeric") or {}).items():
        _check_name(name, f"numeric.{name}")
        if len(rng) != 2:
            raise FeatureSpecError("a numeric range is [lo, hi]", f"numeric.{name}")
        lo, hi = float(rng[0]), float(rng[1])
        if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
            raise FeatureSpecError(f"the range of {name!r} must be finite numbers with lo < hi", f"numeric.{name}")
        if not math.isfinite(hi - lo):
            raise FeatureSpecError(f"the range of {name!r} is too wide (hi - lo overflows)", f"numeric.{name}")
        numeric[name] = [lo, hi]
    categorical = list(raw.get("categorical") or [])
    for name in categorical:
        _check_name(name, "categorical")
        if name in numeric:
            raise FeatureSpecError(f"field {name!r} is declared both numeric and categorical", "categorical")
    if len(set(categorical)) != len(categorical):
        raise FeatureSpecError("a categorical field is declared twice", "categorical")
    if not numeric and not categorical:
        raise FeatureSpecError("declare at least one numeric or categorical field", "numeric")
    if len(numeric) + len(categorical) > MAX_FIELDS:
        raise FeatureSpecError(f"at most {MAX_FIELDS} fields", "numeric")
    out_of_range = raw.get("out_of_range", "refuse")
    if out_of_range not in OUT_OF_RANGE:
        raise FeatureSpecError(f"out_of_range must be one of {OUT_OF_RANGE}", "out_of_range")
    unknown = raw.get("unknown_fields", "refuse")
    if unknown not in UNKNOWN_FIELDS:
        raise FeatureSpecError(f"unknown_fields must be one of {UNKNOWN_FIELDS}", "unknown_fields")
    return {"type": "hashed", "dim": D, "numeric": dict(sorted(numeric.items())), "categorical": sorted(categorical),
            "out_of_range": out_of_range, "unknown_fields": unknown, "hash": HASH, "seed": SEED}


def _check_name(name: Any, where: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_FIELD_NAME or any(
            ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise FeatureSpecError(f"field names are 1 to {MAX_FIELD_NAME} characters without control characters",
                               where)


def bucket(token: str, dim: int) -> tuple[int, float]:
    """(bucket, sign) of a token: MurmurHash3 x64 128 under ``SEED``; low 64 bits mod dim, top bit the sign."""
    h = mmh3.hash128(token.encode("utf-8", "surrogatepass"), seed=SEED, x64arch=True, signed=False)
    return (h & _LOW64) % dim, (-1.0 if h >> 127 else 1.0)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _tokens(spec: Mapping[str, Any], features: Mapping[str, Any], idx: list[int], val: list[float]) -> None:
    """Append the (bucket, signed value) of every token of one dictionary, fields in sorted order."""
    if not isinstance(features, Mapping):
        raise FeatureError("features must be an object of field -> value", None)
    D = spec["dim"]
    numeric, categorical = spec["numeric"], spec["categorical"]
    if len(features) > MAX_FIELDS:
        raise FeatureError(f"at most {MAX_FIELDS} fields per example", None)
    for name in sorted(features):
        v = features[name]
        if v is None:
            continue
        rng = numeric.get(name)
        if rng is not None:
            if not _is_number(v) or not math.isfinite(v):
                raise FeatureError(f"field {name!r} is numeric: send a finite number", name)
            lo, hi = rng
            if not lo <= v <= hi:
                if spec["out_of_range"] != "clip":
                    raise FeatureError(f"field {name!r} is outside its declared range [{lo:g}, {hi:g}]", name,
                                       "out-of-range-feature")
                v = min(max(v, lo), hi)
            s = min(1.0, max(-1.0, 2.0 * ((float(v) - lo) / (hi - lo)) - 1.0))
            b, sign = bucket(name, D)
            idx.append(b)
            val.append(sign * s)
        elif name in categorical:
            if isinstance(v, str):
                items: Iterable[str] = (v,)
            elif isinstance(v, list) and all(isinstance(t, str) for t in v):
                if len(v) > MAX_LIST:
                    raise FeatureError(f"field {name!r} holds more than {MAX_LIST} items", name)
                items = sorted(v)
            else:
                raise FeatureError(f"field {name!r} is categorical: send a string or a list of strings", name)
            for t in items:
                if len(t) > MAX_STRING:
                    raise FeatureError(f"a value of field {name!r} is longer than {MAX_STRING} characters", name)
                b, sign = bucket(name + "\x00" + t, D)
                idx.append(b)
                val.append(sign)
        elif spec["unknown_fields"] == "refuse":
            raise FeatureError(f"field {name!r} is not declared in the model's feature spec", name, "unknown-feature")


def featurize(spec: Mapping[str, Any], features: Mapping[str, Any], x_norm: float) -> np.ndarray:
    """The dense vector (length ``spec["dim"]``, L2 norm <= ``x_norm``) of one feature dictionary."""
    return featurize_many(spec, [features], x_norm)[0]


def featurize_many(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], x_norm: float) -> np.ndarray:
    """The (n, dim) matrix of ``rows``, each row exactly ``featurize`` of it; a refusal names the example
    (``FeatureError.index``) and the field.  Filled in chunks of ``chunk_rows(dim)`` rows (issue 37, F5-F): the tokens
    of each chunk added in place in their (sorted) order from 0.0 (``np.add.at``, unbuffered: the sums bincount
    made before, bit for bit, whatever the batch or the chunk), then clipped in place, so the peak is the output
    itself, never a second n x dim copy, and the work is the tokens plus one pass for the norms."""
    D = spec["dim"]
    n = len(rows)
    X = np.empty((n, D))
    step = chunk_rows(D)
    for a in range(0, n, step):
        b = min(n, a + step)
        idx, val = _flat_tokens(spec, rows, a, b)
        # zeroed by fill, which releases the GIL: the first touch of the block's fresh pages (the kernel zeroing
        # them, 2 MiB at a time with huge pages) would otherwise happen inside np.add.at, holding the GIL for
        # ~14 ms per 160 MB and stalling every other request of the process (issue 37, fairness)
        X[a:b].fill(0.0)
        if len(idx):  # unbuffered, in token order from 0.0: each bucket's sum is bincount's, no n x dim temporary
            np.add.at(X[a:b].reshape(-1), idx, val)
            clip_rows(X[a:b], x_norm, out=X[a:b])
    return X


def _flat_tokens(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], a: int, b: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of ``rows[a:b]`` in row, then token order: their positions in the flat (b - a) x dim block
    ((i - a) dim + bucket, int64) and their signed values; a refusal names the example (``FeatureError.index``)."""
    D = spec["dim"]
    idx: list[int] = []
    val: list[float] = []
    for i in range(a, b):
        start = len(idx)
        try:
            _tokens(spec, rows[i], idx, val)
        except FeatureError as e:
            e.index = i
            raise
        if i > a:
            off = (i - a) * D
            idx[start:] = [t + off for t in idx[start:]]
    return np.asarray(idx, dtype=np.int64), np.asarray(val, dtype=np.float64)


def _require_dictionaries(F: Sequence[Mapping[str, Any] | None] | None, n: int) -> None:
    """``features-required`` naming the first of the ``n`` examples that carries no dictionary."""
    missing = next((i for i in range(n) if F is None or F[i] is None), None)
    if missing is not None:
        raise FeatureError("this model takes feature dictionaries: send 'features', not 'x'", "x",
                           "features-required", missing)


def sparse_rows(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any] | None], x_norm: float) -> Any:
    """The rows ``featurize_many`` gives, as an (n, dim) CSR array of their non-zero buckets alone: what a
    prediction scores (issue 37, F5-F: a hashed row of dim 10^5 holding a few tokens is a few products, not 10^5,
    and 1 000 of them a few kB, not 800 MB).  Each bucket holds the same sum (its tokens added in order from 0.0,
    ``np.add.at``); a row's L2 norm, for the clipping, is summed over its non-zeros alone, so a clipped row, and any
    score, may differ from the dense product's in the last bits.  A missing dictionary is ``features-required``."""
    D = spec["dim"]
    n = len(rows)
    _require_dictionaries(rows, n)
    keys, val = _flat_tokens(spec, rows, 0, n)
    flat, inverse = np.unique(keys, return_inverse=True)  # sorted: row, then bucket
    data = np.zeros(len(flat))
    np.add.at(data, inverse, val)  # unbuffered, in token order from 0.0
    row_of = flat // D
    norms = np.sqrt(np.bincount(row_of, weights=data * data, minlength=n))
    over = norms > x_norm
    if over.any():  # clip_rows's scaling, on the non-zeros
        data *= np.where(over, x_norm / np.where(over, norms, 1.0), 1.0)[row_of]
        again = np.sqrt(np.bincount(row_of, weights=data * data, minlength=n)) > x_norm
        if again.any():  # rounding: one ulp-scale step further in
            data[again[row_of]] *= 1.0 - 4 * np.finfo(np.float64).eps
    indptr = np.searchsorted(row_of, np.arange(n + 1))
    return csr_array((data, flat % D, indptr), shape=(n, D))


class HashedRows:
    """A hashed model's feature dictionaries already made ``sparse_rows`` where their body was decoded (the decode
    pool's process: app/api/decode_pool.py), with the spec and radius they were hashed under."""

    def __init__(self, rows: Any, spec: Mapping[str, Any], x_norm: float):
        self.rows, self.spec, self.x_norm = rows, spec, x_norm

    def __len__(self) -> int:
        return self.rows.shape[0]

    def for_spec(self, spec: Mapping[str, Any], x_norm: float) -> Any:
        """The rows, once seen to be hashed under this spec and radius (a model's never change)."""
        if self.spec != spec or self.x_norm != x_norm:
            raise RuntimeError("rows hashed under another feature spec than the model's")
        return self.rows


CHUNK_BYTES = 8 << 20  # one chunk of dense rows (8 MiB) while a request is encoded and scored chunk by chunk


def chunk_rows(width: int) -> int:
    """Rows of ``width`` float64 values per chunk: at most CHUNK_BYTES, at least one row."""
    return max(1, CHUNK_BYTES // (8 * max(1, int(width))))


def dense_width(spec: Any) -> int:
    """The width of the dense rows a request of a model becomes before the engine sees them: the hashed
    dimension of its feature spec, else its (raw) dimension."""
    features = getattr(spec, "features", None)
    return int(features["dim"]) if features else int(spec.dim)


def clip_norm(x: np.ndarray, x_norm: float) -> np.ndarray:
    """``x`` scaled down onto the L2 ball of radius ``x_norm`` (unchanged when inside it)."""
    return clip_rows(x[None, :], x_norm)[0]


def clip_rows(X: np.ndarray, x_norm: float, out: np.ndarray | None = None) -> np.ndarray:
    """Each row of ``X`` scaled down onto the L2 ball of radius ``x_norm`` (rows inside it unchanged); in place
    when ``out`` is ``X`` itself."""
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    over = norms > x_norm
    if over.any():
        X = X.copy() if out is None else out
        X[over] *= (x_norm / norms[over])[:, None]
        norms2 = np.sqrt(np.einsum("ij,ij->i", X, X))
        again = norms2 > x_norm  # rounding: one ulp-scale step further in
        if again.any():
            X[again] *= 1.0 - 4 * np.finfo(np.float64).eps
    return X


def dense_rows(spec: Mapping[str, Any] | None, x_norm: float, X: Sequence[Any] | None,
               F: Sequence[Mapping[str, Any] | None] | None) -> Any:
    """The feature vectors of a request whose examples each carry a dense ``x`` (``X[i]``) or a dictionary
    (``F[i]``), for a model with feature spec ``spec`` (None: a dense model).  A hashed model takes dictionaries
    only (``features-required``); a dense model, dense vectors only (``features-not-declared``).  Dense vectors
    are returned as given (the caller's checks apply), dictionaries featurized."""
    n = len(X) if X is not None else len(F or ())
    has_f = F is not None and any(f is not None for f in F)
    if spec is None:
        if has_f:
            i = next(i for i, f in enumerate(F) if f is not None)
            raise FeatureError("this model declares no feature dictionaries: send a dense 'x'", "features",
                               "features-not-declared", i)
        return X
    _require_dictionaries(F, n)
    return featurize_many(spec, F, x_norm)
