"""The retained-example store of data-holding families, read by the engine through ``RetainedData``.

Examples are sealed in **chunks** (issue 36 item 2): the records of one public group (the engine's
``retained_groups``, a pure function of the step: sisa's shard, 0 for the other families) in step order, up to
``capacity(dim)`` records (4 096, or 512 KiB of rows) per chunk.  A replay reads and decrypts a chunk at a time, so it
pays one key unwrap and one AES-GCM call per few thousand records instead of per record (issue 36: ~25 us per record
before), and a forget of sisa reads only its shard's chunks.

Crypto-shredding (docs/operations.md, "What is erased where, and when"): no example is ever written in the clear.
Each chunk is sealed (AES-256-GCM) under its own random 32-byte data key, stored wrapped by the service's encryption
key (``app.crypto.Cipher``, envelope encryption) in a separate row of ``retained_chunk_keys``:

    retained_chunks.sealed       = nonce (12) | AES-GCM(chunk key, X as n x d <f8 | y as n <f8, AAD) + tag (16)
    retained_chunk_keys.wrapped  = Cipher.seal(chunk key, "retained-chunk-key", "<model>:<chunk id>")
    AAD                          = b"olu:retained-chunk:<model>:<chunk id>:<group>:" + the chunk's steps (n x <i8)

A forget re-seals each chunk that held a forgotten record without it, under a fresh key and a new chunk id, and
deletes the old chunk row and its key row, all in the forget's transaction.  A copy of the old sealed chunk left
anywhere (a WAL frame, a PostgreSQL dead tuple or WAL segment, a backup, a freed disk block) is then useless unless
a copy of that same key row *and* the encryption key survive too; the database alone (without the encryption key,
which lives outside it) never opens any example.  Key rotation re-wraps only the small key rows
(``app.db.reseal``); the sealed chunks are not rewritten.

A learn adds its records to the group's last chunk when both are small (below ``SMALL_BYTES`` of rows, and the
learn's rows for the group below half of it: the tail is re-sealed with them under a fresh key), else in new chunks,
so a stream of small learns does not leave a chunk per record, and a learn rewrites at most ``SMALL_BYTES`` of
earlier rows per group it touches.
"""
from __future__ import annotations

import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Iterator, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import bindparam, delete, func, insert, select

from ..crypto import DecryptionError
from .tables import RetainedChunk, RetainedChunkKey

NONCE = 12
KEY = 32
TAG = 16
PURPOSE = "retained-chunk-key"
CHUNK_RECORDS = 4096       # most records per chunk
CHUNK_BYTES = 512 << 10   # ... and at most this many bytes of rows (a forget re-seals its chunk: ~1 ms)
SMALL_BYTES = 64 << 10     # a group's last chunk below this is re-sealed with the next learn's records
IN_CHUNK = 500             # bound on bound parameters per IN (...) query

_C, _K = RetainedChunk.__table__, RetainedChunkKey.__table__
_META = select(_C.c.id, _C.c.grp, _C.c.first_step, _C.c.last_step, _C.c.n)
_BODY = (select(_C.c.id, _C.c.grp, _C.c.steps, _C.c.sealed, _K.c.wrapped)
         .select_from(_C.join(_K, _K.c.chunk_id == _C.c.id)))
_BODY_OF = _BODY.where(_C.c.id.in_(bindparam("ids", expanding=True)))
# the same columns by the driver on PostgreSQL, in binary format (fetch_bodies)
_BODY_SQL = (f"SELECT c.id, c.grp, c.steps, c.sealed, k.wrapped FROM {_C.name} c JOIN {_K.name} k "
             f"ON k.chunk_id = c.id WHERE c.id = ANY(%s)")


def fetch_bodies(session, ids: list[str]) -> list:
    """(id, grp, steps, sealed, wrapped) of the chunks ``ids`` in ``session``'s transaction.  On PostgreSQL through
    the driver's cursor in binary format: psycopg's default text format sends bytea as hex, which the server encodes
    and the client decodes (130 MB of chunks: 0.73-1.16 s in text, 0.18-0.55 s in binary, on this project's 2-core
    machine); a retrain's forget at 10^6 records reads ~264 MB.  Elsewhere the Core query."""
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        return session.execute(_BODY_OF, {"ids": ids}).all()
    with conn.connection.driver_connection.cursor(binary=True) as cur:
        cur.execute(_BODY_SQL, [list(ids)])
        return cur.fetchall()

Groups = Callable[[np.ndarray], np.ndarray]
_PREFETCH = ThreadPoolExecutor(max_workers=4, thread_name_prefix="olu-retained-read")


def _one_group(steps: np.ndarray) -> np.ndarray:
    return np.zeros(len(steps), dtype=np.int64)


def capacity(dim: int) -> int:
    """Most records one chunk holds at dimension ``dim``."""
    return max(1, min(CHUNK_RECORDS, CHUNK_BYTES // (8 * (int(dim) + 1))))


def _aad(model_id: str, chunk_id: str, grp: int, steps: bytes) -> bytes:
    return f"olu:retained-chunk:{model_id}:{chunk_id}:{int(grp)}:".encode() + steps


@dataclass
class Chunk:
    """One opened chunk: its id, group, and the (steps, X, y) it holds (read-only arrays)."""
    id: str
    grp: int
    steps: np.ndarray
    X: np.ndarray
    y: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.X.nbytes + self.y.nbytes + self.steps.nbytes


def seal_chunk(cipher, model_id: str, grp: int, steps: np.ndarray, X: np.ndarray, y: np.ndarray
               ) -> tuple[dict, dict]:
    """(chunk row, key row) of the records (steps ascending); a fresh random data key, chunk id and nonce each time."""
    if cipher is None:
        raise TypeError("sealing retained examples needs the service's cipher")
    steps = np.ascontiguousarray(steps, dtype="<i8")
    chunk_id = secrets.token_hex(16)
    rnd = os.urandom(KEY + NONCE)
    data_key, nonce = rnd[:KEY], rnd[KEY:]
    step_bytes = steps.tobytes()
    plain = np.ascontiguousarray(X, dtype="<f8").tobytes() + np.ascontiguousarray(y, dtype="<f8").tobytes()
    sealed = nonce + AESGCM(data_key).encrypt(nonce, plain, _aad(model_id, chunk_id, grp, step_bytes))
    row = {"id": chunk_id, "model_id": model_id, "grp": int(grp), "first_step": int(steps[0]),
           "last_step": int(steps[-1]), "n": len(steps), "steps": step_bytes, "sealed": sealed}
    return row, {"chunk_id": chunk_id, "model_id": model_id,
                 "wrapped": cipher.seal(data_key, PURPOSE, f"{model_id}:{chunk_id}")}


def open_chunk(cipher, model_id: str, dim: int, chunk_id: str, grp: int, step_bytes: bytes, sealed: bytes,
               wrapped: bytes) -> Chunk:
    """The records of one sealed chunk (DecryptionError when it does not authenticate in its place)."""
    data_key = cipher.open(wrapped, PURPOSE, f"{model_id}:{chunk_id}")
    if len(data_key) != KEY:  # an unsealed (legacy) value is never accepted as a key
        raise DecryptionError(f"retained chunk key of {model_id}:{chunk_id} is not a sealed data key")
    step_bytes, sealed = bytes(step_bytes), memoryview(sealed)
    steps = np.frombuffer(step_bytes, dtype="<i8")
    n, d = len(steps), int(dim)
    if len(sealed) != NONCE + 8 * n * (d + 1) + TAG:
        raise DecryptionError(f"retained chunk {model_id}:{chunk_id} does not match the model's dimension")
    plain = np.empty(n * (d + 1), dtype="<f8")
    try:  # straight into the array the rows are read from: a chunk of megabytes is not copied on the way
        AESGCM(data_key).decrypt_into(bytes(sealed[:NONCE]), sealed[NONCE:],
                                      _aad(model_id, chunk_id, grp, step_bytes), plain.view(np.uint8))
    except InvalidTag:  # never echo key bytes
        raise DecryptionError(f"retained chunk {model_id}:{chunk_id} does not authenticate") from None
    X, y = plain[: n * d].reshape(n, d), plain[n * d :]
    steps = steps.copy()[:]  # a view of memory of its own (the engine's compiled loops re-view it writable)
    for a in (steps, X, y):
        a.flags.writeable = False  # shared by a computation's passes (and cached): readers never change them
    return Chunk(chunk_id, int(grp), steps, X, y)


class SqlRetained:
    """The store of one model over a session (the write transaction of a learn or a forget; reads in a read one).
    ``groups``: the engine's ``retained_groups`` (needed to add, and to find a step's chunk)."""

    def __init__(self, session, model_id: str, dim: int, cipher=None, groups: Groups | None = None):
        self.s, self.model_id, self.dim, self.cipher = session, model_id, int(dim), cipher
        self.groups = groups  # None: unknown (a reader without the engine): a step is looked for in every group

    # ---- reading ------------------------------------------------------------------------------------------------
    def _rows(self, stmt, params: dict | None = None) -> list:
        return self.s.execute(stmt, params or {}).all()

    def __len__(self) -> int:
        (n,), = self._rows(select(func.coalesce(func.sum(_C.c.n), 0)).where(_C.c.model_id == self.model_id))
        return int(n)

    def _opened(self, row) -> Chunk:
        return open_chunk(self.cipher, self.model_id, self.dim, row[0], row[1], row[2], row[3], row[4])

    def _bodies(self, ids: list[str]) -> list:
        return fetch_bodies(self.s, ids)

    def _load(self, ids: Sequence[str]) -> dict[str, Chunk]:
        out: dict[str, Chunk] = {}
        ids = list(ids)
        for i in range(0, len(ids), IN_CHUNK):
            for row in self._bodies(ids[i:i + IN_CHUNK]):
                out[row[0]] = self._opened(row)
        return out

    def _group_metas(self, g: int | None, lo: int, hi: int) -> list:
        """(id, grp, first, last, n) of the chunks of group ``g`` (None: any group) meeting steps [lo, hi].  A group's
        chunks hold disjoint step ranges (a learn appends later steps; a forget re-seals a chunk with fewer), so they
        are the chunks whose last step is in [lo, hi] and the first one after hi: two index range reads."""
        if g is None:
            return self._rows(_META.where(_C.c.model_id == self.model_id, _C.c.last_step >= lo,
                                          _C.c.first_step <= hi))
        mine = _META.where(_C.c.model_id == self.model_id, _C.c.grp == g)
        inside = self._rows(mine.where(_C.c.last_step >= lo, _C.c.last_step <= hi))
        after = self._rows(mine.where(_C.c.last_step > hi).order_by(_C.c.last_step).limit(1))
        return inside + [m for m in after if m[2] <= hi]

    def _covering(self, steps: np.ndarray) -> list[str]:
        """The ids of the chunks holding any of ``steps`` (sorted, unique): per group, the chunks whose step range
        meets the steps' range, kept when one of the steps falls inside it."""
        groups = None if self.groups is None else self.groups(steps)
        ids: list[str] = []
        for g in [None] if groups is None else np.unique(groups).tolist():
            mine = steps if g is None else steps[groups == g]
            for cid, _grp, first, last, _n in self._group_metas(g, int(mine[0]), int(mine[-1])):
                k = int(np.searchsorted(mine, first))
                if k < len(mine) and mine[k] <= last:
                    ids.append(cid)
        return ids

    def get(self, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        wanted = np.asarray(steps, dtype=np.int64).reshape(-1)
        if not len(wanted):
            return np.zeros((0, self.dim)), np.zeros(0)
        ordered = bool(np.all(wanted[1:] > wanted[:-1]))
        uniq = wanted if ordered else np.unique(wanted)
        chunks = sorted(self._load(self._covering(uniq)).values(), key=lambda c: int(c.steps[0]))
        pieces_X, pieces_y, found = [], [], 0
        taken = np.zeros(len(uniq), dtype=bool)
        for c in chunks:  # each chunk gives the wanted steps it holds: a slice where they are consecutive rows
            lo, hi = np.searchsorted(uniq, c.steps[0]), np.searchsorted(uniq, c.steps[-1], side="right")
            if hi <= lo:
                continue
            want = uniq[lo:hi]
            idx = np.searchsorted(c.steps, want)
            ok = (idx < len(c.steps))
            ok[ok] = c.steps[idx[ok]] == want[ok]
            if not ok.all() or taken[lo:hi].any():
                if taken[lo:hi].any():  # several groups' chunks interleave: fall back to the general gather
                    return self._gather(chunks, wanted)
                continue
            taken[lo:hi] = True
            found += hi - lo
            if idx[-1] - idx[0] == len(idx) - 1:
                pieces_X.append(c.X[idx[0] : idx[-1] + 1])
                pieces_y.append(c.y[idx[0] : idx[-1] + 1])
            else:
                pieces_X.append(c.X[idx])
                pieces_y.append(c.y[idx])
        if found != len(uniq):
            return self._gather(chunks, wanted)
        X = pieces_X[0].copy() if len(pieces_X) == 1 else np.concatenate(pieces_X)
        y = pieces_y[0].copy() if len(pieces_y) == 1 else np.concatenate(pieces_y)
        if ordered:
            return X, y
        at = np.searchsorted(uniq, wanted)
        return X[at], y[at]

    @staticmethod
    def _gather(chunks: list[Chunk], wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not chunks:
            raise KeyError(f"steps not retained: {wanted[:5].tolist()}")
        held = np.concatenate([c.steps for c in chunks])
        order = np.argsort(held, kind="stable")
        pos = np.minimum(np.searchsorted(held[order], wanted), len(held) - 1)
        missing = held[order][pos] != wanted
        if missing.any():
            raise KeyError(f"steps not retained: {wanted[missing][:5].tolist()}")
        idx = order[pos]
        return np.concatenate([c.X for c in chunks])[idx], np.concatenate([c.y for c in chunks])[idx]

    def _metas(self) -> list:
        return self._rows(_META.where(_C.c.model_id == self.model_id).order_by(_C.c.first_step, _C.c.id))

    def chunks(self, size: int, exclude: Collection[int] = ()) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(steps, X, y) in step order, at most ``size`` records each, skipping ``exclude``.  Chunks are opened in
        order of their first step; the records of several groups interleave, so those below the next chunk's first
        step are final and given out (a model of one group never waits)."""
        skip = np.unique(np.fromiter((int(t) for t in exclude), dtype=np.int64))
        metas = self._metas()
        size = max(1, int(size))
        batches, batch, budget = [], [], 16 << 20  # open a few chunks per query (about 16 MiB of rows)
        for m in metas:
            batch.append(m[0])
            budget -= 8 * int(m[4]) * (self.dim + 2)
            if budget <= 0 or len(batch) >= IN_CHUNK:
                batches.append(batch)
                batch, budget = [], 16 << 20
        if batch:
            batches.append(batch)
        loaded = self._opened_batches(batches)
        opened: dict[str, Chunk] = {}
        pending: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        for i, meta in enumerate(metas):
            if meta[0] not in opened:
                opened = next(loaded, {})
            c = opened.pop(meta[0], None)
            if c is None:  # removed since the listing (another writer): this computation's result is discarded
                continue
            bound = metas[i + 1][2] if i + 1 < len(metas) else None
            if pending is None and (bound is None or c.steps[-1] < bound):
                ready, pending = (c.steps, c.X, c.y), None
            else:
                parts = [(c.steps, c.X, c.y)] if pending is None else [pending, (c.steps, c.X, c.y)]
                S = np.concatenate([p[0] for p in parts])
                order = np.argsort(S, kind="stable")
                S = S[order]
                X = np.concatenate([p[1] for p in parts])[order]
                y = np.concatenate([p[2] for p in parts])[order]
                cut = len(S) if bound is None else int(np.searchsorted(S, bound))
                ready = (S[:cut], X[:cut], y[:cut])
                pending = (S[cut:], X[cut:], y[cut:]) if cut < len(S) else None
            yield from _pieces(ready, size, skip)
        if pending is not None:
            yield from _pieces(pending, size, skip)

    def _opened_batches(self, batches: list[list[str]]) -> Iterator[dict[str, Chunk]]:
        for ids in batches:
            yield self._load(ids)

    # ---- writing (in the write transaction) ---------------------------------------------------------------------
    def _insert(self, rows: list[dict], keys: list[dict]) -> None:
        if rows:
            self.s.execute(insert(_K), keys)
            self.s.execute(insert(_C), rows)

    def _drop(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        for i in range(0, len(ids), IN_CHUNK):
            part = ids[i:i + IN_CHUNK]
            self.s.execute(delete(_K).where(_K.c.chunk_id.in_(part)))
            self.s.execute(delete(_C).where(_C.c.id.in_(part)))

    def _sealed(self, grp: int, steps: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[list[dict], list[dict]]:
        rows, keys = [], []
        cap = capacity(self.dim)
        for a in range(0, len(steps), cap):
            row, key = seal_chunk(self.cipher, self.model_id, grp, steps[a:a + cap], X[a:a + cap], y[a:a + cap])
            rows.append(row)
            keys.append(key)
        return rows, keys

    def _small_tails(self, groups: list[int], small: int) -> dict[int, Chunk]:
        """Per group among ``groups``, its last chunk (highest steps) when it holds fewer than ``small`` records."""
        last = (select(_C.c.grp, func.max(_C.c.last_step).label("last"))
                .where(_C.c.model_id == self.model_id, _C.c.grp.in_(groups)).group_by(_C.c.grp).subquery())
        tails = self._rows(select(_C.c.id, _C.c.n).select_from(_C.join(
            last, (_C.c.grp == last.c.grp) & (_C.c.last_step == last.c.last)))
            .where(_C.c.model_id == self.model_id, _C.c.n < small))
        return {c.grp: c for c in self._load([cid for cid, _ in tails]).values()}

    def add(self, steps: np.ndarray, X: np.ndarray, y: np.ndarray) -> None:
        steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        if not len(steps):
            return
        X = np.asarray(X, dtype=np.float64).reshape(len(steps), self.dim)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        groups = (self.groups or _one_group)(steps)
        small = max(1, SMALL_BYTES // (8 * (self.dim + 1)))
        found = np.unique(groups).tolist()
        tails = {}
        for i in range(0, len(found), IN_CHUNK):
            tails.update(self._small_tails(found[i:i + IN_CHUNK], small))
        rows: list[dict] = []
        keys: list[dict] = []
        dropped: list[str] = []
        single = len(found) == 1
        for g in found:
            if single:
                s, Xg, yg = steps, X, y
            else:
                sel = groups == g
                s, Xg, yg = steps[sel], X[sel], y[sel]
            old = tails.get(g)
            if old is not None and 2 * len(s) < small and int(old.steps[-1]) < int(s[0]):
                # a small tail and a small learn: re-sealed together under a fresh key (a learn of more rows
                # leaves the tail as it is: rewriting it would double what the learn writes)
                s = np.concatenate([old.steps, s])
                Xg, yg = np.concatenate([old.X, Xg]), np.concatenate([old.y, yg])
                dropped.append(old.id)
            r, k = self._sealed(g, s, Xg, yg)
            rows += r
            keys += k
        self._drop(dropped)
        self._insert(rows, keys)

    def erase(self, steps: Sequence[int]) -> int:
        """Re-seal each chunk holding one of ``steps`` without it (fresh key, new id), destroying the old chunk and
        its key; the number of examples erased."""
        wanted = np.unique(np.asarray([int(t) for t in steps], dtype=np.int64))
        if not len(wanted):
            return 0
        n = 0
        rows: list[dict] = []
        keys: list[dict] = []
        old = self._load(self._covering(wanted))
        for c in old.values():
            hit = np.isin(c.steps, wanted)
            n += int(hit.sum())
            keep = ~hit
            if keep.any():
                r, k = self._sealed(c.grp, c.steps[keep], c.X[keep], c.y[keep])
                rows += r
                keys += k
        self._drop(old)
        self._insert(rows, keys)
        return n

    def erase_all(self) -> int:
        self.s.execute(delete(_K).where(_K.c.model_id == self.model_id))
        (n,), = self._rows(select(func.coalesce(func.sum(_C.c.n), 0)).where(_C.c.model_id == self.model_id))
        self.s.execute(delete(_C).where(_C.c.model_id == self.model_id))
        return int(n)


def _pieces(part: tuple[np.ndarray, np.ndarray, np.ndarray], size: int, skip: np.ndarray
            ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    steps, X, y = part
    if len(skip) and len(steps) and skip[-1] >= steps[0] and skip[0] <= steps[-1]:  # skip is sorted
        at = np.minimum(np.searchsorted(skip, steps), len(skip) - 1)
        keep = skip[at] != steps
        if not keep.all():
            steps, X, y = steps[keep], X[keep], y[keep]
    for a in range(0, len(steps), size):
        yield steps[a:a + size], X[a:a + size], y[a:a + size]


class ShortReadRetained(SqlRetained):
    """``SqlRetained`` read by a computation made outside any transaction (app/services/concurrency.py): each query
    runs in its own short read transaction, so no transaction stays open while the engine computes (an open SQLite
    reader would hold back the WAL checkpoint that follows a forget).  The reads may come from different snapshots;
    the write that follows checks that the model's version has not moved, and every change of the retained examples
    moves it, so a result computed from them is only kept when all of them were the examples of that version.
    ``check`` runs before each read (it stops an abandoned computation)."""

    CACHE_BYTES = 64 * 2**20  # opened chunks kept for the computation's later passes (engines iterate)

    def __init__(self, db, model_id: str, dim: int, cipher=None, check=None, groups: Groups | None = None):
        super().__init__(None, model_id, dim, cipher, groups)
        self.db, self.check = db, check or (lambda: None)
        self._cache: dict[str, Chunk] = {}
        self._cached = 0
        self._metas_of: dict[int | None, list | bool] = {}
        self._looked: dict[int | None, bool] = {}

    def _rows(self, stmt, params: dict | None = None) -> list:
        self.check()  # every read: an abandoned computation stops at its next one (issue 29)
        with self.db.read() as s:
            return s.execute(stmt, params or {}).all()

    def _bodies(self, ids: list[str]) -> list:
        self.check()
        with self.db.read() as s:
            return fetch_bodies(s, ids)

    def _load(self, ids: Sequence[str]) -> dict[str, Chunk]:
        """Chunks never change (a rewrite gets a new id), so those opened once are kept up to CACHE_BYTES."""
        self.check()
        out = {i: self._cache[i] for i in ids if i in self._cache}
        fresh = super()._load([i for i in ids if i not in out]) if len(out) < len(ids) else {}
        for i, c in fresh.items():
            if self._cached + c.nbytes <= self.CACHE_BYTES:
                self._cache[i] = c
                self._cached += c.nbytes
        out.update(fresh)
        return out

    GROUP_LIST = 1024  # a group of at most this many chunks has its list read once per computation

    def _group_metas(self, g: int | None, lo: int, hi: int) -> list:
        """A group looked up again by this computation (a replay reading one group in several calls: sisa's shard)
        has its chunk list read once and kept (the snapshot argument above covers it too) where it is short; a
        first look-up, or a long list, is by range."""
        metas = self._metas_of.get(g)
        if metas is None and not self._looked.get(g):
            self._looked[g] = True
            return super()._group_metas(g, lo, hi)
        if metas is None:
            q = _META.where(_C.c.model_id == self.model_id)
            metas = self._rows((q if g is None else q.where(_C.c.grp == g)).order_by(_C.c.first_step)
                               .limit(self.GROUP_LIST + 1))
            if len(metas) > self.GROUP_LIST:
                metas = False
            self._metas_of[g] = metas
        if metas is False:
            return super()._group_metas(g, lo, hi)
        return [m for m in metas if m[3] >= lo and m[2] <= hi]

    def _opened_batches(self, batches: list[list[str]]) -> Iterator[dict[str, Chunk]]:
        """The next batch is read and opened on a helper thread while the engine computes on this one (its
        compiled loops release the GIL): a replay costs about the larger of reading and computing, not their sum."""
        ahead = None
        try:
            for k in range(len(batches)):
                current = ahead.result() if ahead is not None else self._load(batches[k])
                ahead = _PREFETCH.submit(self._load, batches[k + 1]) if k + 1 < len(batches) else None
                yield current
        finally:
            if ahead is not None:
                ahead.cancel()

    def add(self, *_args) -> None:  # writes go through SqlRetained, in the write transaction
        raise TypeError("ShortReadRetained is read-only")

    erase = erase_all = add
