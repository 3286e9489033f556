"""Section ``accuracy``, its data sets and protocol constants (bench/accuracy/accuracy.py has the protocol in its
docstring, the runs and the table; bench/accuracy/accuracy_docs.py writes docs/accuracy.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from app.unlearning import SpecError

EPSILON, DELTA = 1.0, 1e-6
FRACTIONS = (0.01, 0.10)
TEST_FRACTION = 0.2
BATCH = 50
SEEDS = 3
SPLIT_SEED, FORGET_SEED = 0, 1
# the service's defaults of the two spec fields every model declares (app/schemas/models.py ModelCreate)
MODEL_DEFAULTS = {"domain_radius": 10.0, "l2": 0.01}
MILESTONES = ("before", "1 record") + tuple(f"{round(100 * f)}%" for f in FRACTIONS)


def marks(n: int) -> list[int]:
    """How many records are forgotten at each milestone after "before": one record, then the fractions."""
    return [1] + [max(1, round(f * n)) for f in FRACTIONS]


# ---- data sets ---------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    classes: int
    x_norm: float = 1.0
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Entry:
    """One data set of the section: its loss and feature encoding decide whether this build can run it."""

    name: str
    loss: str             # "logistic" | "softmax" (issue 16 item 1)
    features: str         # "dense" | "onehot" (dense encoding of categories) | "hashed" (issue 16 item 2)
    load: Callable[[bool], Prepared]
    what: str


def _split(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    X, y = X[order], y[order]
    n_train = len(y) - int(round(TEST_FRACTION * len(y)))
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def unit_rows(X: np.ndarray) -> np.ndarray:
    """Each row scaled onto the unit sphere (a per-record operation: it uses no other record)."""
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def standardise_then_unit(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centre and scale every column by the training split's mean and standard deviation (fixed before the
    stream), then each row onto the unit sphere: what a client does once to meet ``x_norm = 1``."""
    m, s = X_train.mean(0), X_train.std(0)
    s = np.where(s > 0, s, 1.0)
    return unit_rows((X_train - m) / s), unit_rows((X_test - m) / s)


def _dense(loader: Callable[[], tuple[np.ndarray, np.ndarray]], classes: int) -> Callable[[bool], Prepared]:
    def load(quick: bool) -> Prepared:
        X, y = loader()
        Xtr, ytr, Xte, yte = _split(np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64))
        if quick:  # smoke size: the first 120 records of the stream, 40 held out
            Xtr, ytr, Xte, yte = Xtr[:120], ytr[:120], Xte[:40], yte[:40]
        Xtr, Xte = standardise_then_unit(Xtr, Xte)
        return Prepared(Xtr, ytr, Xte, yte, classes)
    return load


def _breast_cancer():
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(return_X_y=True)


def _digits():
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)


# The categorical stream: scikit-learn's make_classification, half of its columns cut into categories at fixed
# thresholds.  Records are dictionaries {"n0": 0.31, ..., "c0": "c0=3", ...} as a client app would hold them.
CAT_N, CAT_NUMERIC, CAT_CATEGORICAL = 4000, 6, 6
CAT_CUTS = (-1.5, -0.75, 0.0, 0.75, 1.5)       # 6 categories per categorical column
CAT_RANGE = 4.0                                 # declared range of the numeric fields: [-4, 4] (clipped)


def categorical_records(n: int = CAT_N, seed: int = 0) -> tuple[list[dict[str, Any]], np.ndarray]:
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=n, n_features=CAT_NUMERIC + CAT_CATEGORICAL, n_informative=8,
                               n_redundant=2, n_clusters_per_class=2, flip_y=0.03, class_sep=1.0, random_state=seed)
    records = []
    for row in X:
        rec: dict[str, Any] = {f"n{j}": float(row[j]) for j in range(CAT_NUMERIC)}
        for j in range(CAT_CATEGORICAL):
            rec[f"c{j}"] = f"c{j}={int(np.searchsorted(CAT_CUTS, row[CAT_NUMERIC + j]))}"
        records.append(rec)
    return records, y.astype(np.float64)


def encode_onehot(records: list[dict[str, Any]]) -> np.ndarray:
    """Dense encoding from *declared* ranges and vocabularies (never from the data): numeric fields clipped to
    [-CAT_RANGE, CAT_RANGE] and divided by it, each categorical field one-hot over its declared categories, and
    the row divided by the largest norm this encoding can produce, sqrt(#numeric + #categorical), so that
    ||x|| <= 1 for every record.  This is the hook for issue 16 item 2: with hashed feature dictionaries the
    service does this itself (the ``categorical, hashed`` entry sends the records as they are)."""
    width = CAT_NUMERIC + CAT_CATEGORICAL * (len(CAT_CUTS) + 1)
    out = np.zeros((len(records), width))
    for i, rec in enumerate(records):
        for j in range(CAT_NUMERIC):
            out[i, j] = np.clip(rec[f"n{j}"], -CAT_RANGE, CAT_RANGE) / CAT_RANGE
        for j in range(CAT_CATEGORICAL):
            k = int(rec[f"c{j}"].split("=")[1])
            out[i, CAT_NUMERIC + j * (len(CAT_CUTS) + 1) + k] = 1.0
    return out / math.sqrt(CAT_NUMERIC + CAT_CATEGORICAL)


def _categorical_onehot(quick: bool) -> Prepared:
    records, y = categorical_records(300 if quick else CAT_N)
    X = encode_onehot(records)
    Xtr, ytr, Xte, yte = _split(X, y)
    return Prepared(Xtr, ytr, Xte, yte, 2)


def _categorical_hashed(quick: bool) -> Prepared:
    """The same records through the service's hashed feature dictionaries (issue 16 item 2): the encoder is the
    service's (``hashed_encoder``), the spec declared (``hashed_feature_spec``); ``unsupported`` skips this entry
    in a build without it."""
    encode = hashed_encoder()
    if encode is None:
        raise SpecError("no hashed feature encoder in this build")
    records, y = categorical_records(300 if quick else CAT_N)
    X = encode(records)
    Xtr, ytr, Xte, yte = _split(X, y)
    return Prepared(Xtr, ytr, Xte, yte, 2)


HASH_DIM = 64    # hashed dimension of the "categorical, hashed" entry (42 tokens per record; signed buckets)


def hashed_feature_spec(dim: int = HASH_DIM) -> dict[str, Any]:
    """The feature spec a client declares for the categorical stream (app/features.py): every numeric field with
    its declared range [-CAT_RANGE, CAT_RANGE] (clipped, as the one-hot encoding does), every categorical field by
    name; nothing is taken from the data.  Returns the stored (normalised) spec."""
    from app.features import normalize_spec

    raw = {"type": "hashed", "dim": dim, "out_of_range": "clip",
           "numeric": {f"n{j}": [-CAT_RANGE, CAT_RANGE] for j in range(CAT_NUMERIC)},
           "categorical": [f"c{j}" for j in range(CAT_CATEGORICAL)]}
    return normalize_spec(raw, dim)


def hashed_encoder(dim: int = HASH_DIM, x_norm: float = 1.0) -> Callable[[list[dict[str, Any]]], np.ndarray] | None:
    """The service's own encoder of feature dictionaries (app/features.py ``featurize_many``) for the declared
    ``hashed_feature_spec``: numeric fields scaled to [-1, 1] by their declared ranges, categories hashed
    (MurmurHash3) to signed buckets, each vector then clipped to ``x_norm`` -- exactly what the service does at
    learn, predict and forget.  None if this build has no featurizer."""
    try:
        from app.features import featurize_many
    except ImportError:  # pragma: no cover - builds before issue 16 item 2
        return None
    spec = hashed_feature_spec(dim)
    return lambda records: featurize_many(spec, records, x_norm)


DATASETS: tuple[Entry, ...] = (
    Entry("breast-cancer", "logistic", "dense", _dense(_breast_cancer, 2),
          "scikit-learn's bundled breast-cancer, 569 x 30, malignant vs benign"),
    Entry("digits", "softmax", "dense", _dense(_digits, 10),
          "scikit-learn's bundled digits, 1797 x 64, 10 classes"),
    Entry("categorical, one-hot", "logistic", "onehot", _categorical_onehot,
          f"make_classification, {CAT_N} records, {CAT_NUMERIC} numeric + {CAT_CATEGORICAL} categorical fields "
          f"({len(CAT_CUTS) + 1} categories each), dense one-hot from declared vocabularies and ranges"),
    Entry("categorical, hashed", "logistic", "hashed", _categorical_hashed,
          f"the same records as feature dictionaries hashed by the service (app/features.py) into dim = {HASH_DIM}, "
          f"numeric ranges declared [-{CAT_RANGE:g}, {CAT_RANGE:g}], each vector clipped to x_norm = 1"),
)


def unsupported(entry: Entry) -> str | None:
    """Why this build cannot run ``entry`` (None: it can)."""
    from app.unlearning.maths.losses import LOSSES

    if entry.loss not in LOSSES:
        return f"loss {entry.loss!r} is not served by this engine yet (issue 16 item 1); losses: {', '.join(LOSSES)}"
    if entry.features == "hashed" and hashed_encoder() is None:
        return "hashed feature dictionaries are not in this build yet (issue 16 item 2)"
    return None


