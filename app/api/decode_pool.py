"""Large request bodies (learn, unlearn, predict, evaluate) decoded in a separate process (issue 37, F5-G).

orjson.loads, msgpack.unpackb and pydantic's validation of a large body are each one C call that holds the GIL
for its whole length: 12 MiB of columnar JSON took 160 ms in ``orjson.loads`` alone on this project's machine,
and during that time the event loop, which answers every other tenant's small requests, cannot run, whatever
thread the call is made on.  A body above ``OLU_DECODE_PROCESS_BYTES`` (1 MiB by default) is therefore decoded
and validated by the same function as in the server (``parse_learn_body``, or ``json_body.parse`` with the
route's model) in a process of a small pool, from the worker thread that holds the tenant's turn of the fair
scheduler (app/api/models.py, app/api/evaluation.py); that thread waits for the answer without the GIL.

What comes back is what is cheap to take in: the rows as float64 arrays (read from the pipe straight into the
array, the GIL released during each read; the body goes down the same way: ``_Worker.call``),
the ids and labels as lists (at most OLU_MAX_BATCH of them), feature dictionaries as they are, and, when the
request carries an Idempotency-Key, the canonical JSON its fingerprint is computed from.  A refusal comes back as
the same problem the request would get decoded in this process (the same function runs there).

Chosen over the alternatives (docs/operations.md §10.1): a lower JSON body limit would refuse bodies clients send
today, and msgpack decoding holds the GIL too; decoding in chunks needs a streaming parser orjson does not have.
The process pool uses ``spawn`` (a fork of a process running threads may copy a held lock); its processes are the
pool's own, each with one pipe, not a ``ProcessPoolExecutor``, whose pickled calls and results copied the body and
the rows inside single C calls holding the GIL (~5 ms each for 19 MiB: the fairness bench's msgpack row).
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import struct
import threading
import time
from typing import Any

import numpy as np
from scipy.sparse import csr_array
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from ..errors import Problem
from ..features import HashedRows
from ..db.record_batches import PackedDigests
from ..services.records import commitment_digests
from .learn_body import LearnBatch, _ColumnarFingerprint, parse_learn_body


class _Fingerprint:
    """A per-example learn body's canonical JSON, computed where it was decoded (``LearnRequest.model_dump_json``)."""

    def __init__(self, text: str | None):
        self.text = text

    def model_dump_json(self, **kwargs) -> str:
        if self.text is None:
            raise RuntimeError("the fingerprint of this body was not computed (no Idempotency-Key)")
        return self.text


def _rows(X: Any) -> Any:
    """Dense rows as one float64 array when they are rectangular (cheap to send back); else as they are (None
    included)."""
    if isinstance(X, np.ndarray):
        return X
    if X and all(isinstance(r, list) for r in X):
        width = len(X[0])
        if all(len(r) == width for r in X):
            try:
                arr = np.array(X, dtype=np.float64)
            except (TypeError, ValueError, OverflowError):
                return X
            if arr.tolist() == X:  # exactly the numbers sent (no int beyond float precision changed)
                return arr
    return X


def decode_learn(raw: bytes, content_type: str | None, fingerprint: bool, key: bytes | None = None) -> tuple:
    """In the pool's process: ``parse_learn_body`` and what the parent needs of it, refusals included; with the
    tenant's record ``key``, the ids' commitments too (``_digests``)."""
    try:
        batch = parse_learn_body(raw, content_type)
    except RequestValidationError as e:
        return ("validation", e.errors())
    except Problem as e:
        return ("problem", e.status, e.slug, e.detail, e.extra)
    except HTTPException as e:
        return ("http", e.status_code, e.detail)
    if isinstance(batch.model, _ColumnarFingerprint):
        return ("columnar", batch.ids, batch.X, batch.y, _digests(key, batch.ids))
    text = batch.model.model_dump_json() if fingerprint else None
    return ("examples", batch.ids, _rows(batch.X), batch.y, batch.F, text, _digests(key, batch.ids))


def _digests(key: bytes | None, ids: list) -> np.ndarray | None:
    """``commitment_digests(key, ids)`` as one (n, 32) uint8 array (None without a key), computed where the ids
    were decoded: the HMAC loop, ~1 us of Python per id, off the server's GIL, and no second trip to the pool."""
    if key is None:
        return None
    return np.frombuffer(b"".join(commitment_digests(key, ids)), dtype=np.uint8).reshape(len(ids), 32)


def _packed(digests: np.ndarray | None) -> "PackedDigests | None":
    return None if digests is None else PackedDigests(digests.tobytes())


def decode_json(kind: str, raw: bytes, content_type: str | None, fingerprint: bool,
                hashed: tuple[dict, float] | None = None, max_batch: int = 0, key: bytes | None = None) -> tuple:
    """In the pool's process: a predict, evaluate or unlearn body parsed as in this process (app/api/json_body.py)
    and sent back light: dense vectors as arrays, dictionaries as dicts, an unlearn's fingerprint JSON if asked.
    A predict or an evaluate for a hashed model (``hashed``: its feature spec and radius) comes back with its
    dictionaries hashed here into sparse rows (``features.sparse_rows``: the CSR arrays), at most ``max_batch`` of
    them (more: as dicts, refused by the service as any batch too large).  An unlearn's ids come with their
    commitments under the tenant's record ``key`` when it is given (``_digests``)."""
    from ..schemas import PredictRequest, UnlearnRequest
    from ..schemas.evaluation import EvaluateRequest
    from .json_body import parse

    model = {"predict": PredictRequest, "evaluate": EvaluateRequest, "unlearn": UnlearnRequest}[kind]
    try:
        body = parse(model, raw, content_type)
    except RequestValidationError as e:
        return ("validation", e.errors())
    except HTTPException as e:
        return ("http", e.status_code, e.detail)
    if kind == "unlearn":
        examples = body.resent()
        text = body.model_dump_json(exclude=model.UNFINGERPRINTED) if fingerprint else None
        return ("unlearn", list(body.ids), examples, text, _digests(key, body.ids))
    features = body.feature_dicts()
    y = list(body.y) if kind == "evaluate" else None
    if hashed is not None and features is not None and len(features) <= max_batch:
        return _hashed(features, *hashed) + (y,)
    return (kind, _rows(body.x), features, y)


def _hashed(features: list, spec: dict, x_norm: float) -> tuple:
    """Dictionaries as the CSR arrays of ``sparse_rows``, or the problem the service answers for them."""
    from ..features import FeatureError, sparse_rows

    try:
        rows = sparse_rows(spec, features, x_norm)
    except FeatureError as e:
        from ..services.model_core import feature_problem

        p = feature_problem(e, examples=False)
        return ("problem", p.status, p.slug, p.detail, p.extra)
    return ("hashed", rows.data, rows.indices, rows.indptr, rows.shape)


def hash_ids(raw: bytes, key: bytes) -> tuple:
    """In the pool's process: the commitments (``records.commitment_digests``) of the ids in ``raw``, one per line
    (a record id holds no control character), as one (n, 32) uint8 array."""
    return ("digests", _digests(key, raw.decode().split("\n")))


class UnlearnBody(_Fingerprint):
    """An unlearn body decoded in the pool: its ids (and their commitments, when asked), and its fingerprint as
    ``UnlearnRequest`` gives it."""
    UNFINGERPRINTED = {"examples"}

    def __init__(self, ids: list[str], text: str | None, digests: "PackedDigests | None" = None):
        super().__init__(text)
        self.ids, self.digests = ids, digests


def _refused(out: tuple) -> tuple:
    """``out`` itself, or the refusal it carries raised as it was in the pool's process."""
    kind = out[0]
    if kind == "validation":
        raise RequestValidationError(out[1])
    if kind == "problem":
        raise Problem(out[1], out[2], out[3], **out[4])
    if kind == "http":
        raise HTTPException(status_code=out[1], detail=out[2])
    return out


def _answer(out: tuple) -> LearnBatch:
    kind = _refused(out)[0]
    if kind == "columnar":
        _, ids, X, y, digests = out
        return LearnBatch(ids, X, y, _ColumnarFingerprint(ids, X, y), digests=_packed(digests))
    _, ids, X, y, F, text, digests = out
    return LearnBatch(ids, X, y, _Fingerprint(text), F, digests=_packed(digests))


WARM_RETRY_S = 30.0  # a pool whose process failed to start is not started again by warm() for this long
POOLED_IDS = 1_000  # commitments of at least this many ids are computed in the pool (DecodePool.commitments)
ARRAY_BYTES = 64 << 10  # a result array at least this large comes back as raw bytes, not pickled


class Chunks:
    """A large request body as the chunks the server received, never joined in the server's process: joining
    19 MiB took ~10 ms of the event loop holding the GIL (most of it page faults of the fresh buffer), and every
    other tenant's request waited (fairness bench); the pool's process receives the chunks and joins them."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks
        self.size = sum(len(c) for c in chunks)

    def __len__(self) -> int:
        return self.size


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        view = view[os.write(fd, view):]  # each write without the GIL


def _read_into(fd: int, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])  # straight into the buffer, the GIL released during the read
        if n == 0:
            raise EOFError
        got += n


def _serve(conn) -> None:
    """A pool process: forever, a call's name and keyword arguments (pickled, small), then the body (raw bytes);
    answers the result with its large arrays replaced by (shape, dtype) and sent after it as raw bytes."""
    calls = {"decode_learn": decode_learn, "decode_json": decode_json, "hash_ids": hash_ids,
             "ping": lambda raw: ("pong",)}
    while True:
        try:
            name, kwargs, size = conn.recv()
            body = bytearray(size)
            _read_into(conn.fileno(), memoryview(body))
        except (EOFError, OSError):
            return
        raw = bytes(body)
        del body
        try:
            out = calls[name](raw=raw, **kwargs)
        except Exception as e:  # noqa: BLE001 - a decoder's own failure: the parent raises it as an error (a 500)
            out = ("error", f"{type(e).__name__}: {e}"[:500])
        del raw
        arrays = [i for i, v in enumerate(out) if isinstance(v, np.ndarray) and v.dtype.kind in "fiu"
                  and v.nbytes >= ARRAY_BYTES]
        meta = tuple(("__array__", out[i].shape, out[i].dtype.str) if i in arrays else v for i, v in enumerate(out))
        conn.send((meta, arrays))
        for i in arrays:
            conn.send_bytes(memoryview(np.ascontiguousarray(out[i])).cast("B"))


class _Broken(Exception):
    """A pool process died or its pipe broke in the middle of a call."""


class _Worker:
    """One pool process and the parent's end of its pipe."""

    def __init__(self, ctx):
        self.conn, theirs = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_serve, args=(theirs,), name="olu-decode", daemon=True)
        self.proc.start()
        theirs.close()

    def call(self, name: str, raw: "bytes | Chunks", kwargs: dict) -> tuple:
        """Send the call and take the result in.  The body goes down the pipe from its own buffer and the large
        arrays come up into theirs, each system call without the GIL (what ProcessPoolExecutor pickled: the 19 MiB
        body copied into a pickle, the rows copied out of one, each a single C call holding the GIL for ~5 ms)."""
        chunks = raw.chunks if isinstance(raw, Chunks) else [raw]
        try:
            self.conn.send((name, kwargs, len(raw)))
            for chunk in chunks:
                _write_all(self.conn.fileno(), chunk)
            meta, arrays = self.conn.recv()
            out = list(meta)
            for i in arrays:
                _, shape, dtype = meta[i]
                out[i] = self._read_array(shape, np.dtype(dtype))
            return tuple(out)
        except (EOFError, OSError, ValueError) as e:
            raise _Broken() from e

    def _read_array(self, shape, dtype) -> np.ndarray:
        arr = np.empty(shape, dtype=dtype)
        view = memoryview(arr).cast("B")
        fd = self.conn.fileno()
        head = bytearray(4)
        _read_into(fd, memoryview(head))
        (size,) = struct.unpack("!i", head)  # send_bytes's header
        if size != view.nbytes:
            raise ValueError("a decode pool answer does not match its header")
        _read_into(fd, view)
        return arr

    def stop(self) -> None:
        try:
            self.conn.close()
        finally:
            if self.proc.is_alive():
                self.proc.terminate()


class DecodePool:
    """A lazily started pool of at most ``processes`` decoding processes (spawned as bodies need them)."""

    def __init__(self, processes: int):
        self.processes = max(1, int(processes))
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._started = 0
        self._lock = threading.Lock()
        self._ready = False  # a process has answered (warm)
        self._warming = False
        self._retry_at = 0.0  # after a failed start, warm() starts none before this (time.monotonic)

    def warm(self) -> bool:
        """Whether a pool process has answered already; if not, one is started in the background and False is
        answered: work the pool merely speeds up for the others (a hashed model's small bodies, commitments) is then
        done in the server this time rather than wait 1-3 s for the pool's first process to import the app."""
        if self._ready:
            return True
        with self._lock:
            if self._warming or time.monotonic() < self._retry_at:
                return False
            self._warming = True
        threading.Thread(target=self._warm, name="olu-decode-start", daemon=True).start()
        return False

    def _warm(self) -> None:
        try:
            self._run("ping", b"")
            self._ready = True
        except Exception:  # noqa: BLE001 - not started: tried again after WARM_RETRY_S; meanwhile work stays here
            self._retry_at = time.monotonic() + WARM_RETRY_S
        finally:
            self._warming = False

    @property
    def started(self) -> int:
        """Processes started and alive in the pool (0 before the first large body)."""
        return self._started

    def _take(self) -> _Worker:
        with self._lock:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                if self._started < self.processes:
                    self._started += 1
                    try:
                        return _Worker(self._ctx)
                    except Exception:
                        self._started -= 1
                        raise
        return self._idle.get()

    def _run(self, name: str, raw: "bytes | Chunks", **kwargs) -> tuple:
        worker = self._take()
        try:
            out = worker.call(name, raw, kwargs)
        except _Broken:  # a decoding process died (e.g. killed for memory): a fresh one next time
            worker.stop()
            with self._lock:
                self._started -= 1
            raise Problem(503, "not-ready", "The request body could not be decoded now; nothing was changed. Retry.",
                          headers={"Retry-After": "1"}) from None
        except BaseException:
            worker.stop()  # the pipe may hold the rest of an answer: never reused
            with self._lock:
                self._started -= 1
            raise
        self._idle.put(worker)
        if out and out[0] == "error":  # the decoder failed in the pool (a bug, not the body): as it would here
            raise RuntimeError(f"decoding in the pool failed: {out[1]}")
        return out

    def learn_body(self, raw: bytes, content_type: str | None, fingerprint: bool,
                   key: bytes | None = None) -> LearnBatch:
        """Blocking (call it from a worker thread): the learn body decoded in the pool, and with the tenant's
        record ``key`` its ids' commitments (``LearnBatch.digests``)."""
        return _answer(self._run("decode_learn", raw, content_type=content_type, fingerprint=fingerprint, key=key))

    def unlearn_body(self, raw: bytes, content_type: str | None, fingerprint: bool,
                     key: bytes | None = None) -> tuple:
        """Blocking: (body with ``ids``, their commitments under ``key`` if given, and the fingerprint; examples as
        the route passes them on)."""
        _, ids, examples, text, digests = _refused(self._run(
            "decode_json", raw, kind="unlearn", content_type=content_type, fingerprint=fingerprint, key=key))
        return UnlearnBody(ids, text, _packed(digests)), examples

    def inputs(self, kind: str, raw: bytes, content_type: str | None) -> tuple:
        """Blocking: a predict's or an evaluate's (x, features, y) decoded in the pool (y None for predict)."""
        _, x, features, y = _refused(self._run("decode_json", raw, kind=kind, content_type=content_type,
                                               fingerprint=False))
        return x, features, y

    def hashed_inputs(self, kind: str, raw: bytes, content_type: str | None, hashed: tuple[dict, float],
                      max_batch: int) -> tuple:
        """Blocking: a predict's or an evaluate's (x, features, y) for a hashed model (``hashed``: its feature spec
        and radius) decoded in the pool, its dictionaries hashed there (``HashedRows``): parsing, validating and
        hashing 1 000 dictionaries is ~20 ms of Python that, in the server's process, every other request waited on
        for the GIL (issue 37, fairness bench)."""
        out = _refused(self._run("decode_json", raw, kind=kind, content_type=content_type, fingerprint=False,
                                 hashed=hashed, max_batch=max_batch))
        if out[0] != "hashed":
            return out[1], out[2], out[3]
        _, data, indices, indptr, shape, y = out
        return None, HashedRows(csr_array((data, indices, indptr), shape=shape), *hashed), y

    def commitments(self, key: bytes, ids: list[str]) -> "list[bytes] | PackedDigests":
        """Blocking: ``records.commitment_digests(key, ids)``, computed in the pool for many ids (at least
        POOLED_IDS): its loop is ~1 us of Python per id (12 ms for 10 000) that, in the server's process, held the
        GIL in turns with the event loop while every other tenant's request waited (issue 37, fairness bench).
        The tenant's record key goes down the pool's pipe to the server's own child process, as the bodies do,
        and is never stored there.  Computed here while the pool's first process starts (``warm``)."""
        if len(ids) < POOLED_IDS or not self.warm():
            return commitment_digests(key, ids)
        lines = "\n".join(ids)
        if lines.count("\n") != len(ids) - 1:  # an id with a newline (refused by the request's checks): here
            return commitment_digests(key, ids)
        _, digests = self._run("hash_ids", lines.encode(), key=key)
        return _packed(digests)  # never sliced into 10 000 bytes objects unless read one by one

    def shutdown(self) -> None:
        with self._lock:
            self._started = 0
            self._ready = False
            while True:
                try:
                    self._idle.get_nowait().stop()
                except queue.Empty:
                    break
