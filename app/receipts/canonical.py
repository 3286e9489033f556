"""Canonical JSON (RFC 8785 / JCS) and the byte strings that receipts sign and log.

Pure functions, no service dependencies (only ``rfc8785``, ``hashlib``, ``struct``), so that the offline
verifier can import them.

Definitions pinned here (they are part of the receipt contract):

* ``canonical_json(obj)``: RFC 8785 JSON Canonicalization Scheme, UTF-8 bytes.  NaN and ±inf are rejected
  (JSON has no representation for them); so are integers outside the IEEE-754 safe range ±(2**53 - 1),
  because RFC 8785 serialises every number as a double.
* ``receipt_signing_bytes(receipt)``: canonical JSON of the receipt **without** its ``signature`` and
  ``proof`` members.  This is what the Ed25519 signature covers.
* ``receipt_leaf_bytes(receipt)``: canonical JSON of the receipt **including** ``signature`` but without
  ``proof``.  This is the Merkle log leaf data; the leaf hash is ``SHA-256(0x00 || leaf bytes)``.  Including
  the signature in the leaf binds the log entry to exactly one signed receipt (a second, differently
  signed receipt with the same body would be a different leaf).
* ``parameters_sha256(weights, bias)``: hex SHA-256 over the little-endian float64 bytes of ``weights``
  (flattened, C order) followed by ``bias`` (a scalar or a sequence).
* ``erased_records_sha256(commitments)``: the ``records.commitments_sha256`` of a model-erasure receipt: hex
  SHA-256 over the 32-byte record commitments (HMAC-SHA256(tenant record key, record id)) of the erased records,
  **sorted ascending as byte strings and concatenated** (no separator, no length prefix; each is exactly 32
  bytes).  No records: SHA-256 of the empty string.  Sorting makes the hash independent of storage order; the
  set is a set (a model never learns one record id twice).
"""
from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import rfc8785

__all__ = [
    "CanonicalJSONError",
    "canonical_json",
    "receipt_signing_bytes",
    "receipt_leaf_bytes",
    "signed_receipt_bytes",
    "parameters_sha256",
    "erased_records_sha256",
    "UNSIGNED_MEMBERS",
    "UNLOGGED_MEMBERS",
]

#: Members removed from a receipt before computing the bytes that are signed.
UNSIGNED_MEMBERS = ("signature", "proof")
#: Members removed from a receipt before computing the Merkle leaf data.
UNLOGGED_MEMBERS = ("proof",)

_MAX_SAFE_INT = 2**53 - 1


class CanonicalJSONError(ValueError):
    """The value cannot be represented in RFC 8785 canonical JSON."""


def _normalise(obj: Any, path: str) -> Any:
    """Check and convert a JSON-like value; errors name the offending member path."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        if abs(obj) > _MAX_SAFE_INT:
            raise CanonicalJSONError(f"{path}: integer {obj} is outside the RFC 8785 safe range ±(2**53-1)")
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise CanonicalJSONError(f"{path}: {obj!r} is not representable in JSON (NaN/inf are rejected)")
        return float(obj)
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CanonicalJSONError(f"{path}: object keys must be strings, got {type(k).__name__}")
            out[k] = _normalise(v, f"{path}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_normalise(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    # numpy scalars (np.float64, np.int64, np.bool_) without importing numpy
    item = getattr(obj, "item", None)
    if type(obj).__module__ == "numpy" and callable(item) and getattr(obj, "ndim", None) == 0:
        return _normalise(item(), path)
    raise CanonicalJSONError(f"{path}: type {type(obj).__name__} is not JSON-serialisable")


def canonical_json(obj: Any) -> bytes:
    """RFC 8785 canonical JSON of ``obj`` as UTF-8 bytes.

    Raises :class:`CanonicalJSONError` (a ``ValueError``) for NaN/inf, unsafe integers, non-string keys and
    non-JSON types.  Tuples serialise as arrays; numpy scalars as their Python value.
    """
    value = _normalise(obj, "$")
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:  # pragma: no cover - _normalise catches these first
        raise CanonicalJSONError(str(exc)) from exc


def _without(receipt: Mapping[str, Any], members: Sequence[str]) -> dict[str, Any]:
    if not isinstance(receipt, Mapping):
        raise CanonicalJSONError(f"a receipt must be a JSON object, got {type(receipt).__name__}")
    return {k: v for k, v in receipt.items() if k not in members}


def receipt_signing_bytes(receipt: Mapping[str, Any]) -> bytes:
    """Bytes covered by the receipt signature: canonical JSON without ``signature`` and ``proof``."""
    return canonical_json(_without(receipt, UNSIGNED_MEMBERS))


def receipt_leaf_bytes(receipt: Mapping[str, Any]) -> bytes:
    """Merkle leaf data of a receipt: canonical JSON *with* ``signature``, without ``proof``."""
    if "signature" not in receipt:
        raise CanonicalJSONError("a receipt must be signed before it is logged (no 'signature' member)")
    return canonical_json(_without(receipt, UNLOGGED_MEMBERS))


def _floats(values: Any, what: str) -> list[float]:
    # numpy arrays (any shape): flatten in C order without importing numpy here
    if hasattr(values, "ravel") and hasattr(values, "tolist"):
        values = values.ravel().tolist()
    elif isinstance(values, (int, float)) or (hasattr(values, "item") and getattr(values, "ndim", 1) == 0):
        values = [values]
    out = []
    for v in values:
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"{what} contains a non-finite value ({f!r}); published parameters must be finite")
        out.append(f)
    return out


def signed_receipt_bytes(receipt: Mapping[str, Any], sign) -> tuple[str, bytes]:
    """Sign an unsigned receipt: ``(signature, leaf)`` where ``signature = sign(receipt_signing_bytes(receipt))``
    and ``leaf`` is ``receipt_leaf_bytes`` of the receipt with that signature, canonicalising each member once
    (both are one object over the same members, sorted by their UTF-16 code units as RFC 8785 §3.2.3 says; the
    leaf adds ``signature``).  Tests check equality with the two functions above."""
    members = _without(receipt, UNSIGNED_MEMBERS)
    parts = {k: canonical_json(k) + b":" + canonical_json(v) for k, v in members.items()}

    def as_object() -> bytes:
        return b"{" + b",".join(parts[k] for k in sorted(parts, key=lambda k: k.encode("utf-16-be"))) + b"}"

    signature = sign(as_object())
    parts["signature"] = canonical_json("signature") + b":" + canonical_json(signature)
    return signature, as_object()


def parameters_sha256(weights: Any, bias: Any) -> str:
    """Hex SHA-256 of little-endian float64 ``weights`` (flattened) followed by ``bias``.

    ``bias`` may be a scalar or a sequence/array, or None (softmax models publish no separate bias: ``weights`` is
    their K x (d + 1) matrix row-major).  A client recomputes this from ``GET /v1/models/{id}/parameters``:
    ``sha256(struct.pack('<%dd' % n, *weights, bias))`` (softmax: ``*weights`` alone).
    """
    h = hashlib.sha256()
    for values, what in ((weights, "weights"), (bias, "bias")):
        if values is not None:
            h.update(_float_bytes(values, what))
    return h.hexdigest()


def _float_bytes(values: Any, what: str) -> bytes:
    """The little-endian float64 bytes of ``values`` (flattened in C order); a numpy array in one call (26 650
    parameters at D = 1 025 x 26 classes: ~0.1 ms instead of ~10 ms value by value), anything else value by value:
    the same bytes either way."""
    if hasattr(values, "ravel") and hasattr(values, "astype") and hasattr(values, "tobytes"):
        import numpy as np  # the caller passed a numpy array: numpy is there

        flat = np.ascontiguousarray(values, dtype="<f8").ravel()
        if not np.isfinite(flat).all():
            bad = float(flat[~np.isfinite(flat)][0])
            raise ValueError(f"{what} contains a non-finite value ({bad!r}); published parameters must be finite")
        return flat.tobytes()
    vals = _floats(values, what)
    return struct.pack(f"<{len(vals)}d", *vals)


def erased_records_sha256(commitments: Sequence[bytes | str]) -> str:
    """Hex SHA-256 over the sorted 32-byte commitments (each raw bytes or 64 hex digits), concatenated.

    Raises ``ValueError`` for a commitment that is not 32 bytes (or not 64 hex digits)."""
    raw = []
    for c in commitments:
        b = bytes.fromhex(c) if isinstance(c, str) else bytes(c)
        if len(b) != 32:
            raise ValueError("a record commitment is 32 bytes (64 hex digits)")
        raw.append(b)
    raw.sort()
    return hashlib.sha256(b"".join(raw)).hexdigest()
