"""Large request bodies (learn, unlearn, predict, evaluate) decoded in a separate process (issue 37, F5-G).

orjson.loads, msgpack.unpackb and pydantic's validation of a large body are each one C call that holds the GIL
for its whole length: 12 MiB of columnar JSON took 160 ms in ``orjson.loads`` alone on this project's machine,
and during that time the event loop, which answers every other tenant's small requests, cannot run, whatever
thread the call is made on.  A body above ``OLU_DECODE_PROCESS_BYTES`` (1 MiB by default) is therefore decoded
and validated by the same function as in the server (``parse_learn_body``, or ``json_body.parse`` with the
route's model) in a process of a small pool, from the worker thread that holds the tenant's turn of the fair
scheduler (app/api/models.py, app/api/evaluation.py); that thread waits for the answer without the GIL.

What comes back is what is cheap to take in: the rows as float64 arrays (unpickled as one copy of their bytes),
the ids and labels as lists (at most OLU_MAX_BATCH of them), feature dictionaries as they are, and, when the
request carries an Idempotency-Key, the canonical JSON its fingerprint is computed from.  A refusal comes back as
the same problem the request would get decoded in this process (the same function runs there).

Chosen over the alternatives (docs/operations.md §10.1): a lower JSON body limit would refuse bodies clients send
today, and msgpack decoding holds the GIL too; decoding in chunks needs a streaming parser orjson does not have.
The process pool uses ``spawn`` (a fork of a process running threads may copy a held lock).
"""
from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from ..errors import Problem
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


def decode_learn(raw: bytes, content_type: str | None, fingerprint: bool) -> tuple:
    """In the pool's process: ``parse_learn_body`` and what the parent needs of it, refusals included."""
    try:
        batch = parse_learn_body(raw, content_type)
    except RequestValidationError as e:
        return ("validation", e.errors())
    except Problem as e:
        return ("problem", e.status, e.slug, e.detail, e.extra)
    except HTTPException as e:
        return ("http", e.status_code, e.detail)
    if isinstance(batch.model, _ColumnarFingerprint):
        return ("columnar", batch.ids, batch.X, batch.y)
    text = batch.model.model_dump_json() if fingerprint else None
    return ("examples", batch.ids, _rows(batch.X), batch.y, batch.F, text)


def decode_json(kind: str, raw: bytes, content_type: str | None, fingerprint: bool) -> tuple:
    """In the pool's process: a predict, evaluate or unlearn body parsed as in this process (app/api/json_body.py)
    and sent back light: dense vectors as arrays, dictionaries as dicts, an unlearn's fingerprint JSON if asked."""
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
        return ("unlearn", list(body.ids), examples, text)
    features = body.feature_dicts()
    return (kind, _rows(body.x), features, list(body.y) if kind == "evaluate" else None)


class UnlearnBody(_Fingerprint):
    """An unlearn body decoded in the pool: its ids, and its fingerprint as ``UnlearnRequest`` gives it."""
    UNFINGERPRINTED = {"examples"}

    def __init__(self, ids: list[str], text: str | None):
        super().__init__(text)
        self.ids = ids


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
        _, ids, X, y = out
        return LearnBatch(ids, X, y, _ColumnarFingerprint(ids, X, y))
    _, ids, X, y, F, text = out
    return LearnBatch(ids, X, y, _Fingerprint(text), F)


class DecodePool:
    """A lazily started pool of ``processes`` decoding processes (spawned at the first large body)."""

    def __init__(self, processes: int):
        self.processes = max(1, int(processes))
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    def _run(self, fn, *args) -> tuple:
        try:
            return self._executor().submit(fn, *args).result()
        except BrokenProcessPool:  # a decoding process died (e.g. killed for memory): start afresh next time
            with self._lock:
                self._pool = None
            raise Problem(503, "not-ready", "The request body could not be decoded now; nothing was changed. Retry.",
                          headers={"Retry-After": "1"}) from None

    def learn_body(self, raw: bytes, content_type: str | None, fingerprint: bool) -> LearnBatch:
        """Blocking (call it from a worker thread): the learn body decoded in the pool."""
        return _answer(self._run(decode_learn, raw, content_type, fingerprint))

    def unlearn_body(self, raw: bytes, content_type: str | None, fingerprint: bool) -> tuple:
        """Blocking: (body with ``ids`` and the fingerprint, examples as the route passes them on)."""
        _, ids, examples, text = _refused(self._run(decode_json, "unlearn", raw, content_type, fingerprint))
        return UnlearnBody(ids, text), examples

    def inputs(self, kind: str, raw: bytes, content_type: str | None) -> tuple:
        """Blocking: a predict's or an evaluate's (x, features, y) decoded in the pool (y None for predict)."""
        _, x, features, y = _refused(self._run(decode_json, kind, raw, content_type, False))
        return x, features, y

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
