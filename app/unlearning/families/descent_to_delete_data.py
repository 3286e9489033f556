"""Descent-to-delete's data: the kept records of one request in memory when they fit (``cached``), the dataset
D_i of one round (``DatasetView``, streamed, never materialised) and the distributed variant's reservoir
(Algorithm 5, ``reservoir_update``)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..contract.unlearner import ArrayRetained, RetainedData
from ..maths.losses import augment

# A request reads the kept records once into memory while they stay below this many floats (128 MB), instead of
# re-reading (and decrypting) the store on every gradient pass; larger sets are streamed pass by pass.
CACHE_FLOATS = 16_000_000


class RequestData(ArrayRetained):
    """The kept records of one request, read (unwrapped and decrypted) from the store once and held in process
    memory only, as the augmented rows (x, 1) every gradient pass reads: a pass slices them instead of copying and
    augmenting n rows again (issue 32).  Never written anywhere; dropped with the request."""

    def __init__(self, steps: np.ndarray, X_aug: np.ndarray, y: np.ndarray):
        self.steps, self.X_aug, self.y = steps, X_aug, y
        for a in (self.steps, self.X_aug, self.y):
            a.setflags(write=False)  # shared by every round and pass of the request

    @property
    def X(self) -> np.ndarray:  # ArrayRetained's raw rows (get, chunks): a view
        return self.X_aug[:, :-1]

    def augmented(self, exclude: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps, X_aug, y) of the records not in ``exclude``, in step order (no copy when nothing is excluded)."""
        if not len(exclude):
            return self.steps, self.X_aug, self.y
        keep = ~np.isin(self.steps, np.asarray(exclude, dtype=np.int64))
        out = self.steps[keep], self.X_aug[keep], self.y[keep]
        for a in out:
            a.setflags(write=False)  # read by every pass of the round
        return out


def cached(retained: RetainedData | None, dim: int) -> RetainedData | None:
    """The kept records of one request, in memory when they fit CACHE_FLOATS (one read of the store)."""
    if retained is None or isinstance(retained, RequestData) or len(retained) * (dim + 2) > CACHE_FLOATS:
        return retained
    n = len(retained)
    steps, X_aug, y = np.empty(n, np.int64), np.ones((n, dim + 1)), np.empty(n)
    k = 0
    for s, X, v in retained.chunks(4096):
        m = len(s)
        if k + m > n:
            raise ValueError("the retained store changed while it was read")
        steps[k : k + m], X_aug[k : k + m, :dim], y[k : k + m] = s, X, v
        k += m
    if k != n:
        raise ValueError("the retained store changed while it was read")
    return RequestData(steps, X_aug, y)


class DatasetView:
    """The dataset D_i of one round: the retained store minus ``exclude`` plus ``extra`` new examples.

    Streams augmented chunks; never materialises the retained set (over a ``RequestData`` it slices the request's
    rows, minus ``exclude`` copied once per view rather than once per pass; the new rows likewise augmented once).
    """

    def __init__(self, retained: RetainedData | None, exclude: Sequence[int] = (), extra_steps: Any = None,
                 extra_X: Any = None, extra_y: Any = None):
        self.retained = retained
        self.exclude = tuple(int(s) for s in exclude)
        self.extra_steps = np.zeros(0, np.int64) if extra_steps is None else np.asarray(extra_steps, np.int64)
        self.extra_X = None if extra_X is None else np.asarray(extra_X, np.float64)
        self.extra_y = None if extra_y is None else np.asarray(extra_y, np.float64)
        self._kept: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # RequestData minus exclude
        self._extra_aug: np.ndarray | None = None  # the new rows augmented, once per view (not once per pass)

    @property
    def n(self) -> int:
        base = 0 if self.retained is None else len(self.retained) - len(self.exclude)
        return base + len(self.extra_steps)

    def chunks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        if isinstance(self.retained, RequestData):
            if self._kept is None:
                self._kept = self.retained.augmented(self.exclude)
            s, Xa, y = self._kept
            for start in range(0, len(s), size):
                yield s[start : start + size], Xa[start : start + size], y[start : start + size]
        elif self.retained is not None:
            for s, X, y in self.retained.chunks(size, exclude=self.exclude):
                yield s, augment(X), y
        if len(self.extra_steps) and self._extra_aug is None:
            self._extra_aug = augment(self.extra_X)
        for start in range(0, len(self.extra_steps), size):
            sl = slice(start, start + size)
            yield self.extra_steps[sl], self._extra_aug[sl], self.extra_y[sl]

    def steps(self, size: int) -> np.ndarray:
        parts = [s for s, _, _ in self.chunks(size)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def get(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Augmented (X, y) of the given steps, in order."""
        steps = np.asarray(steps, np.int64)
        out_X = np.empty((len(steps), 0))
        out_y = np.empty(len(steps))
        in_extra = np.isin(steps, self.extra_steps)
        if in_extra.any():
            idx = np.searchsorted(self.extra_steps, steps[in_extra])
            ex = augment(self.extra_X[idx])
            out_X = np.empty((len(steps), ex.shape[1]))
            out_X[in_extra] = ex
            out_y[in_extra] = self.extra_y[idx]
        rest = ~in_extra
        if rest.any():
            X, y = self.retained.get(steps[rest])
            ra = augment(X)
            if out_X.shape[1] != ra.shape[1]:
                out_X = np.empty((len(steps), ra.shape[1]))
            out_X[rest] = ra
            out_y[rest] = y
        return out_X, out_y


def reservoir_update(slots: np.ndarray, kind: str, step: int, n_after: int, pool: np.ndarray | None,
                     rng: np.random.Generator) -> np.ndarray:
    """Algorithm 5 (reservoir sampling with replacement), in place on one copy's B slots; returns changed slots.

    add: N ~ Binomial(B, 1/n_i) distinct slots (n_i the size after the addition) take the new record.
    delete: every slot holding the record gets an independent uniform draw from D_i (``pool``, after deletion).
    Records are identified by their unique step, never by value (pitfall 15).
    """
    B = len(slots)
    if kind == "add":
        N = rng.binomial(B, 1.0 / n_after)
        idx = np.sort(rng.choice(B, size=N, replace=False))
        slots[idx] = step
    else:
        idx = np.flatnonzero(slots == step)
        slots[idx] = pool[rng.integers(0, len(pool), size=len(idx))]
    return idx
