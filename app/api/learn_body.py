"""The learn request body in its two shapes, decoded without a pydantic model per example.

- per-example ``{"examples": [{"id", "x", "y"}]}`` (``LearnRequest``): validated by pydantic exactly as before;
- columnar ``{"ids": [..], "x": [[..]], "y": [..]}`` (``LearnColumnarRequest``): decoded by orjson and converted
  straight into float64 arrays by numpy, in JSON or, for bulk clients, as ``application/msgpack`` (where ``x`` and
  ``y`` may also be raw little-endian float64 bytes, row-major).

Both shapes get the same checks with the same answers: ids are 1..256-character strings, at least one example,
numbers only and finite (422 validation-error); the service then checks the batch limit (413), duplicate ids
(422/409), the dimension (422 invalid-dimension) and the declared bounds (422 out-of-bounds-input).
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from ..errors import Problem
from ..schemas import LearnRequest, RecordId

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
_IDS = TypeAdapter(list[RecordId])
_NUMBER_TYPES = {float, int}  # what JSON and msgpack numbers decode to (bool is a subclass of int: not listed)


@dataclass
class LearnBatch:
    ids: list[str]
    X: Any  # list of lists (per-example shape) or a float64 array (columnar)
    y: Any
    model: Any  # what the idempotency fingerprint is computed from (``model_dump_json``)
    F: list | None = None  # per example, its feature dictionary or None (per-example shape only)
    digests: Any = None  # the ids' commitments when computed where the body was decoded (the decode pool), else None


class _ColumnarFingerprint:
    """The columnar batch fingerprinted as its per-example equivalent: a retry in either shape replays."""

    def __init__(self, ids: list[str], X: np.ndarray, y: np.ndarray):
        self.ids, self.X, self.y = ids, X, y

    def model_dump_json(self, **kwargs) -> str:
        from ..schemas import Example

        return LearnRequest.model_construct(examples=[
            Example.model_construct(id=i, x=row, y=v) for i, row, v in zip(self.ids, self.X.tolist(), self.y.tolist())
        ]).model_dump_json(**kwargs)


def _error(loc: tuple, msg: str, kind: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("body", *loc), "msg": msg, "type": kind}])


def _decode(raw: bytes, content_type: str) -> Any:
    if not raw:
        raise _error((), "Field required", "missing")
    if content_type.split(";")[0].strip().lower() in MSGPACK_TYPES:
        try:
            import msgpack  # optional dependency (extra "fast"); without it msgpack bodies are refused
        except ImportError:
            raise Problem(415, "unsupported-media-type", "This server does not accept application/msgpack "
                          "(the msgpack package is not installed); send JSON.") from None
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=True)
        except Exception:  # noqa: BLE001 - any decode failure is the client's
            raise _error((), "msgpack decode error", "msgpack_invalid") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # as before: Python's json accepts NaN/Infinity literals, which then fail the finiteness check
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise _error((0,), "JSON decode error", "json_invalid") from None


_NUMBER_BYTES = b"0123456789.eE+-,[]: \t\r\n"


def _json_holds_only_numbers_besides_ids(raw: bytes, n_ids: int) -> bool:
    """Whether a columnar JSON body can hold nothing but numbers in ``x`` and ``y``, read off its bytes: one C-speed
    pass deletes every byte a JSON number or the array syntax can use (a type check per leaf cost ~15% of a
    1000 x 64 learn); what is left are the keys, the ids and any other token.  True when that rest has no escape,
    exactly the quotes of the three keys and of the ``n_ids`` ids, and no ``true``/``false``/``null`` literal
    (seen with their e's deleted).  A body that fails this (e.g. an id containing "true") takes the per-leaf
    check, which decides."""
    rest = raw.translate(None, _NUMBER_BYTES)
    return (b"\\" not in rest and rest.count(b'"') == 6 + 2 * n_ids
            and b"tru" not in rest and b"fals" not in rest and b"null" not in rest)


def _floats(value: Any, name: str, n: int | None, numbers_only: bool = False) -> np.ndarray:
    """A float64 array from a (nested) list of numbers or, in msgpack, raw little-endian float64 bytes."""
    if isinstance(value, (bytes, bytearray)):
        if len(value) % 8:
            raise _error((name,), "raw float64 bytes must have a length divisible by 8", "bytes_invalid")
        arr = np.frombuffer(value, dtype="<f8").astype(np.float64)
        if name == "x":
            if not n or arr.size % n:
                raise _error((name,), f"raw x must hold {n} rows of equal length", "bytes_invalid")
            arr = arr.reshape(n, arr.size // n)
        return arr
    if not isinstance(value, list):
        raise _error((name,), "Input should be a valid list", "list_type")
    if name == "x" and not all(isinstance(row, list) for row in value):
        i = next(i for i, row in enumerate(value) if not isinstance(row, list))
        raise _error((name, i), "Input should be a valid list", "list_type")
    # numbers only, as the per-example shape (strict floats): numpy would turn true into 1.0 and "0.5" into 0.5
    leaves = itertools.chain.from_iterable(value) if name == "x" else value
    if not numbers_only and not set(map(type, leaves)) <= _NUMBER_TYPES:
        raise _error((name,), "Input should be a valid number", "float_type")
    try:
        arr = np.array(value, dtype=np.float64)
    except ValueError as e:
        if "inhomogeneous" in str(e) or "sequence" in str(e):  # ragged rows: as the per-example shape answers
            raise Problem(422, "invalid-dimension", "Every feature vector must have the model's dimension.") from None
        raise _error((name,), "Input should be a valid number", "float_parsing") from None
    except (TypeError, OverflowError):
        raise _error((name,), "Input should be a valid number", "float_parsing") from None
    return arr


def _columnar(obj: dict, raw: bytes | None = None) -> LearnBatch:
    extra = set(obj) - {"ids", "x", "y"}
    if extra:
        key = sorted(map(str, extra))[0]
        raise _error((key,), "Extra inputs are not permitted", "extra_forbidden")
    for key in ("ids", "x", "y"):
        if key not in obj:
            raise _error((key,), "Field required", "missing")
    try:
        ids = _IDS.validate_python(obj["ids"])
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", "ids", *err["loc"])} for err in e.errors()]) from None
    if not ids:
        raise _error(("ids",), "List should have at least 1 item after validation, not 0", "too_short")
    n = len(ids)
    numbers_only = raw is not None and _json_holds_only_numbers_besides_ids(raw, n)
    y = _floats(obj["y"], "y", n, numbers_only)
    X = _floats(obj["x"], "x", n, numbers_only)
    if y.shape != (n,):
        raise _error(("y",), f"y must be a list of {n} numbers, one per id", "invalid_length")
    if X.ndim != 2 or X.shape[0] != n:
        raise _error(("x",), f"x must be a list of {n} feature vectors, one per id", "invalid_length")
    bad = ~np.isfinite(X).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _error(("x", i), "Input should be a finite number", "finite_number")
    bad = ~np.isfinite(y)
    if bad.any():
        raise _error(("y", int(np.flatnonzero(bad)[0])), "Input should be a finite number", "finite_number")
    return LearnBatch(ids, X, y, _ColumnarFingerprint(ids, X, y))


def parse_learn_body(raw: bytes, content_type: str | None) -> LearnBatch:
    """Decode and validate a learn body of either shape (RequestValidationError -> 422 validation-error)."""
    obj = _decode(raw, content_type or "application/json")
    if isinstance(obj, dict) and "examples" not in obj and ("ids" in obj or "x" in obj or "y" in obj):
        json_body = (content_type or "application/json").split(";")[0].strip().lower() not in MSGPACK_TYPES
        return _columnar(obj, raw if json_body else None)
    try:
        body = LearnRequest.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
    ex = body.examples
    F = [e.features for e in ex]
    if any(f is not None for f in F):
        F = [None if f is None else f.root for f in F]
    else:
        F = None
    return LearnBatch([e.id for e in ex], [e.x for e in ex], [e.y for e in ex], body, F)


def openapi_request_body() -> dict:
    """The learn requestBody: either shape in JSON; the columnar shape in msgpack, described by the vendor extension
    ``x-msgpack`` rather than a second ``content`` entry: SDK generators (openapi-python-client) and contract
    fuzzers only know JSON-family bodies, and a msgpack entry made the generator drop it with a warning."""
    ref = "#/components/schemas/"
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"oneOf": [{"$ref": ref + "LearnRequest"},
                                                  {"$ref": ref + "LearnColumnarRequest"}]}},
    }, "x-msgpack": {
        "mediaTypes": list(MSGPACK_TYPES),
        "schema": {"$ref": ref + "LearnColumnarRequest"},
        "description": "The columnar body may also be sent as MessagePack under any of these content types; x and "
                       "y may then be raw little-endian float64 bytes (x row-major). Dense models only. 415 when "
                       "the server lacks the msgpack package.",
    }}}
