"""Named float64/int64 arrays and numbers <-> one bytes blob.  No pickle: a JSON header and raw arrays.

Layout: b"OLU1" | uint32 LE header length | header JSON | concatenated little-endian array bytes.
Header: {"arrays": {name: [dtype, shape, offset, nbytes]}, "scalars": {name: number}}.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Mapping

import numpy as np

MAGIC = b"OLU1"
_DTYPES = {"f8": np.dtype("<f8"), "i8": np.dtype("<i8")}


def pack_state(state: Mapping[str, Any]) -> bytes:
    arrays: dict[str, list] = {}
    scalars: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "f":
                code, arr = "f8", np.asarray(value, dtype="<f8")
            elif value.dtype.kind in "iub":
                code, arr = "i8", np.asarray(value, dtype="<i8")
            else:
                raise TypeError(f"state array {name!r} has unsupported dtype {value.dtype}")
            raw = arr.tobytes(order="C")
            arrays[name] = [code, list(arr.shape), offset, len(raw)]
            chunks.append(raw)
            offset += len(raw)
        elif isinstance(value, (bool, np.bool_)):
            scalars[name] = bool(value)
        elif isinstance(value, (int, np.integer)):
            scalars[name] = int(value)
        elif isinstance(value, (float, np.floating)):
            scalars[name] = {"f": float(value).hex()}  # exact float round-trip, inf/nan safe
        elif value is None or isinstance(value, str):
            scalars[name] = value
        else:
            raise TypeError(f"state value {name!r} of type {type(value).__name__} cannot be stored")
    header = json.dumps({"arrays": arrays, "scalars": scalars}, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + b"".join(chunks)


def unpack_state(blob: bytes) -> dict[str, Any]:
    if blob[:4] != MAGIC:
        raise ValueError("not an OLU state blob")
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8 : 8 + hlen])
    base = 8 + hlen
    out: dict[str, Any] = {}
    for name, (code, shape, offset, nbytes) in header["arrays"].items():
        start = base + offset
        out[name] = np.frombuffer(blob[start : start + nbytes], dtype=_DTYPES[code]).reshape(tuple(shape)).copy()
    for name, value in header["scalars"].items():
        out[name] = float.fromhex(value["f"]) if isinstance(value, dict) else value
    return out
