"""The retained-example store of data-holding families, read by the engine through ``RetainedData``.

Examples are keyed by (model, step), streamed in step order with keyset pagination (never all at once), and
deleted outright when their record is forgotten.

Crypto-shredding (docs/operations.md, "What is erased where, and when"): no example is ever written in the clear.
Each one is sealed (AES-256-GCM) under its own random 32-byte data key, and the data key is stored wrapped by the
service's encryption key (``app.crypto.Cipher``, envelope encryption) in a separate row of ``retained_keys``:

    retained_examples.sealed = nonce (12) | AES-GCM(data key, x as <f8 bytes | y as <f8, AAD) + tag (16)
    retained_keys.wrapped    = Cipher.seal(data key, "retained-key", "<model>:<step>")
    AAD                      = b"olu:retained:<model>:<step>"   (a row copied onto another example fails)

Forgetting deletes the key row and the sealed row in the forget's transaction.  A copy of the sealed row left
anywhere (a WAL frame, a PostgreSQL dead tuple or WAL segment, a backup, a replica, a freed disk block) is then
useless unless a copy of that same key row *and* the encryption key survive too; the database alone (without the
encryption key, which lives outside it) never opens any example.  Key rotation re-wraps only the small key rows
(``app.db.reseal``); the sealed examples are not rewritten.
"""
from __future__ import annotations

import os
from typing import Collection, Iterator, Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import and_, delete, func, insert, select

from ..crypto import DecryptionError
from .tables import RetainedExample, RetainedKey

NONCE = 12
KEY = 32
PURPOSE = "retained-key"

_E, _K = RetainedExample.__table__, RetainedKey.__table__
_JOINED = (select(_E.c.step, _E.c.sealed, _K.c.wrapped)
           .select_from(_E.join(_K, and_(_K.c.model_id == _E.c.model_id, _K.c.step == _E.c.step))))


def _owner(model_id: str, step: int) -> str:
    return f"{model_id}:{step}"


def _aad(model_id: str, step: int) -> bytes:
    return f"olu:retained:{model_id}:{step}".encode()


def seal_example(cipher, model_id: str, step: int, x: np.ndarray, y: float) -> tuple[bytes, bytes]:
    """(sealed example, wrapped data key) of one example; a fresh random data key and nonce each time."""
    rnd = os.urandom(KEY + NONCE)
    data_key, nonce = rnd[:KEY], rnd[KEY:]
    plain = np.ascontiguousarray(x, dtype="<f8").tobytes() + np.float64(y).astype("<f8").tobytes()
    sealed = nonce + AESGCM(data_key).encrypt(nonce, plain, _aad(model_id, step))
    return sealed, cipher.seal(data_key, PURPOSE, _owner(model_id, step))


def open_example(cipher, model_id: str, step: int, sealed: bytes, wrapped: bytes) -> bytes:
    """The plaintext ``x | y`` bytes (little-endian float64) of one example."""
    data_key = cipher.open(wrapped, PURPOSE, _owner(model_id, step))
    if len(data_key) != KEY:  # an unsealed (legacy) value is never accepted as a key
        raise DecryptionError(f"retained key of {model_id}:{step} is not a sealed data key")
    sealed = bytes(sealed)
    try:
        return AESGCM(data_key).decrypt(sealed[:NONCE], sealed[NONCE:], _aad(model_id, step))
    except Exception:  # InvalidTag: never echo key bytes
        raise DecryptionError(f"retained example {model_id}:{step} does not authenticate") from None


class SqlRetained:
    def __init__(self, session, model_id: str, dim: int, cipher=None):
        self.s, self.model_id, self.dim, self.cipher = session, model_id, dim, cipher

    def __len__(self) -> int:
        return int(self.s.execute(select(func.count()).select_from(RetainedExample)
                                  .where(RetainedExample.model_id == self.model_id)).scalar_one())

    def _open(self, rows) -> tuple[np.ndarray, np.ndarray]:
        d = self.dim
        buf = b"".join(open_example(self.cipher, self.model_id, int(t), sealed, wrapped) for t, sealed, wrapped in rows)
        XY = np.frombuffer(buf, dtype="<f8").reshape(len(rows), d + 1)
        return XY[:, :d].copy(), XY[:, d].copy()

    def get(self, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        wanted = [int(t) for t in steps]
        rows: dict[int, tuple] = {}
        for i in range(0, len(wanted), 500):
            part = wanted[i : i + 500]
            for r in self.s.execute(_JOINED.where(_E.c.model_id == self.model_id, _E.c.step.in_(part))):
                rows[int(r[0])] = r
        missing = [t for t in wanted if t not in rows]
        if missing:
            raise KeyError(f"steps not retained: {missing[:5]}")
        if not wanted:
            return np.zeros((0, self.dim)), np.zeros(0)
        return self._open([rows[t] for t in wanted])

    def chunks(self, size: int, exclude: Collection[int] = ()) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        skip = {int(t) for t in exclude}
        after = 0
        while True:
            page = self.s.execute(_JOINED.where(_E.c.model_id == self.model_id, _E.c.step > after)
                                  .order_by(_E.c.step).limit(size)).all()
            if not page:
                return
            after = int(page[-1][0])
            kept = [r for r in page if int(r[0]) not in skip]
            if kept:
                X, y = self._open(kept)
                yield np.array([r[0] for r in kept], dtype=np.int64), X, y

    def add(self, steps: np.ndarray, X: np.ndarray, y: np.ndarray) -> None:
        examples, keys = [], []
        for t, x, v in zip(steps, X, y):
            sealed, wrapped = seal_example(self.cipher, self.model_id, int(t), x, float(v))
            examples.append({"model_id": self.model_id, "step": int(t), "sealed": sealed})
            keys.append({"model_id": self.model_id, "step": int(t), "wrapped": wrapped})
        if examples:
            self.s.execute(insert(_K), keys)
            self.s.execute(insert(_E), examples)

    def erase(self, steps: Sequence[int]) -> int:
        """Destroy the data keys and the sealed examples of ``steps``; the number of examples erased."""
        wanted = [int(t) for t in steps]
        n = 0
        for i in range(0, len(wanted), 500):
            part = wanted[i : i + 500]
            self.s.execute(delete(_K).where(_K.c.model_id == self.model_id, _K.c.step.in_(part)))
            n += self.s.execute(delete(_E).where(_E.c.model_id == self.model_id, _E.c.step.in_(part))).rowcount
        return n

    def erase_all(self) -> int:
        self.s.execute(delete(_K).where(_K.c.model_id == self.model_id))
        return self.s.execute(delete(_E).where(_E.c.model_id == self.model_id)).rowcount


class ShortReadRetained(SqlRetained):
    """``SqlRetained`` read by a computation made outside any transaction (app/services/concurrency.py): each call,
    and each page of ``chunks``, reads in its own short read transaction, so no transaction stays open while the
    engine computes (an open SQLite reader would hold back the WAL checkpoint that follows a forget).  The pages may
    come from different snapshots; the write that follows checks that the model's version has not moved, and every
    change of the retained examples moves it, so a result computed from them is only kept when all of them were
    the examples of that version.  ``check`` runs before each read (it stops an abandoned computation)."""

    CACHE_BYTES = 64 * 2**20  # pages kept decoded for the computation's later passes (engines iterate)

    def __init__(self, db, model_id: str, dim: int, cipher=None, check=None):
        super().__init__(None, model_id, dim, cipher)
        self.db, self.check = db, check or (lambda: None)
        self._pages: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray] | None] = {}
        self._cached = 0

    def __len__(self) -> int:
        self.check()
        with self.db.read() as self.s:
            return super().__len__()

    def get(self, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        self.check()
        with self.db.read() as self.s:
            return super().get(steps)

    def _page(self, size: int, after: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(steps, X, y) of the ``size`` examples after step ``after``, or None past the end.  One computation
        reads the same pages again on every pass: they are the same examples as long as its result is kept
        (see above), so they are decoded once and kept up to CACHE_BYTES."""
        self.check()  # every page, a cached one too: an abandoned computation stops at its next pass (issue 29)
        key = (size, after)
        if key in self._pages:
            return self._pages[key]
        with self.db.read() as s:
            rows = s.execute(_JOINED.where(_E.c.model_id == self.model_id, _E.c.step > after)
                             .order_by(_E.c.step).limit(size)).all()
        page = None
        if rows:
            X, y = self._open(rows)
            page = (np.array([r[0] for r in rows], dtype=np.int64), X, y)
            for a in page:
                a.setflags(write=False)  # shared by the passes: an engine must not change what it reads
        if self._cached + (0 if page is None else page[1].nbytes) <= self.CACHE_BYTES:
            self._pages[key] = page
            self._cached += 0 if page is None else page[1].nbytes + page[2].nbytes
        return page

    def chunks(self, size: int, exclude: Collection[int] = ()) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        skip = np.fromiter((int(t) for t in exclude), dtype=np.int64)
        after = 0
        while True:
            page = self._page(size, after)
            if page is None:
                return
            steps, X, y = page
            after = int(steps[-1])
            if len(skip):
                keep = ~np.isin(steps, skip)
                steps, X, y = steps[keep], X[keep], y[keep]
            if len(steps):
                yield steps, X, y

    def add(self, *_args) -> None:  # writes go through SqlRetained, in the write transaction
        raise TypeError("ShortReadRetained is read-only")

    erase = erase_all = add
