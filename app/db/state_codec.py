"""Named float64/int64/uint8 arrays and numbers <-> one bytes blob.  No pickle: a JSON header and raw arrays.

Layout: b"OLU1" | uint32 LE header length | header JSON | concatenated little-endian array bytes.
Header: {"arrays": {name: [dtype, shape, offset, nbytes]}, "scalars": {name: number}}.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Mapping

import numpy as np

MAGIC = b"OLU1"
_DTYPES = {"f8": np.dtype("<f8"), "i8": np.dtype("<i8"), "u1": np.dtype("u1")}


def pack_state(state: Mapping[str, Any]) -> bytes:
    arrays: dict[str, list] = {}
    scalars: dict[str, Any] = {}
    chunks: list[np.ndarray] = []
    offset = 0
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "f":
                code, arr = "f8", np.asarray(value, dtype="<f8")
            elif value.dtype == np.uint8:  # raw bytes (exact_ridge's narrow words: narrow_words.py)
                code, arr = "u1", value
            elif value.dtype.kind in "iub":
                code, arr = "i8", np.asarray(value, dtype="<i8")
            else:
                raise TypeError(f"state array {name!r} has unsupported dtype {value.dtype}")
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)  # joined below: one copy, not two
            arrays[name] = [code, list(arr.shape), offset, raw.nbytes]
            chunks.append(raw)
            offset += raw.nbytes
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


# ---- page patches: what a write changed in a packed state (issue 36 item 1; app/db/state_log.py) ----------------
PAGE = 4096
PATCH_MAGIC = b"OLUP"
_DIGEST = 16


def _split(blob: bytes) -> tuple[bytes, memoryview]:
    """(header with its prefix, array bytes) of a packed state."""
    if blob[:4] != MAGIC:
        raise ValueError("not an OLU state blob")
    (hlen,) = struct.unpack("<I", blob[4:8])
    return bytes(blob[: 8 + hlen]), memoryview(blob)[8 + hlen :]


def page_digests(blob: bytes) -> bytes:
    """The array bytes' length (8 bytes) and a 16-byte BLAKE2b digest of each of their PAGE-byte pages: what a later
    ``page_patch`` compares with (a page whose digest is unchanged is not written again)."""
    _, body = _split(blob)
    out = [struct.pack("<Q", len(body))]
    for a in range(0, len(body), PAGE):
        out.append(hashlib.blake2b(body[a : a + PAGE], digest_size=_DIGEST).digest())
    return b"".join(out)


def page_patch(blob: bytes, digests: bytes | None) -> tuple[bytes | None, bytes]:
    """(patch, digests of ``blob``): the patch turns the state whose digests are ``digests`` into ``blob`` (its new
    header and the pages whose digest changed); None when the array bytes changed length (a new layout)."""
    new = page_digests(blob)
    if digests is None or len(digests) != len(new) or digests[:8] != new[:8]:
        return None, new
    head, body = _split(blob)
    a = np.frombuffer(new, dtype=np.uint8, offset=8).reshape(-1, _DIGEST)
    b = np.frombuffer(digests, dtype=np.uint8, offset=8).reshape(-1, _DIGEST)
    changed = np.flatnonzero((a != b).any(axis=1)).astype("<i8")
    pages = b"".join(bytes(body[i * PAGE : (i + 1) * PAGE]) for i in changed.tolist())
    patch = (PATCH_MAGIC + struct.pack("<I", len(head)) + head + struct.pack("<I", len(changed))
             + changed.tobytes() + pages)
    return patch, new


def apply_page_patch(blob: bytes, patch: bytes) -> bytes:
    """The packed state ``page_patch`` described: ``blob`` with the patch's header and pages."""
    if patch[:4] != PATCH_MAGIC:
        raise ValueError("not an OLU state patch")
    (hlen,) = struct.unpack("<I", patch[4:8])
    head = patch[8 : 8 + hlen]
    at = 8 + hlen
    (count,) = struct.unpack("<I", patch[at : at + 4])
    at += 4
    pages = np.frombuffer(patch, dtype="<i8", count=count, offset=at)
    at += 8 * count
    _, body = _split(blob)
    out = bytearray(body)
    for i in pages.tolist():
        end = min(len(out), (i + 1) * PAGE)
        out[i * PAGE : end] = patch[at : at + end - i * PAGE]
        at += end - i * PAGE
    if at != len(patch):
        raise ValueError("a state patch does not fit the state it is applied to")
    return head + bytes(out)
