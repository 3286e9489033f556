"""int64 words stored in fewer bytes: exact_ridge's sums as written at every forget (issue 39).

A forget rewrites the whole sealed state (the old one held the record: state_store.py), and at D = 1 025 that is
A's upper triangle, 525 825 int64 words, 4.2 MB: packing, sealing, the SQLite write and its fsync cost in
proportion to those bytes.  The words are sums of quantised products, far below 2^63 for most entries (with 3 000
letter-shaped records 99 % fit in 5 bytes), so each is stored as its ``w`` low bytes (two's complement: a word
fits when -2^(8w-1) <= v < 2^(8w-1)), and the few that do not fit as exceptions (index, value) beside them.
``w`` (1, 2, 4, 5, 6, or 8: no exception) minimises the bytes stored, n w + 16 e(w).  The low four bytes and the
rest are two arrays (``_nlo``, ``_nhi``), so both ways are a few whole-array casts and shifts (~1 ms at 525 825
words), not a byte-by-byte gather.  Exact both ways: ``wide(narrow(v)) == v`` bit for bit, on any byte order.

Only the storage changes: what the engine holds, solves from and publishes is the int64 words as before.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

FULL = 8
WIDTHS = (6, 5, 4, 2, 1)  # tried widest first; 3 and 7 bytes have no numpy integer type
EXCEPTION_BYTES = 16      # an int64 index and an int64 value
_LOW = np.int64(0xFFFFFFFF)


def _parts(w: int) -> tuple[int, int]:
    """Bytes in the low array and in the high array of a word stored in ``w`` bytes."""
    return (w, 0) if w <= 4 else (4, w - 4)


def narrow(words: np.ndarray, name: str) -> dict[str, np.ndarray | int]:
    """``words`` (int64, any shape: stored flat) as ``name``_nw (bytes per word), ``name``_nlo and ``name``_nhi (the low
    four bytes and the rest, little-endian, as uint8) and ``name``_nxi, ``name``_nxv (the exceptions' flat indices and
    values, int64)."""
    v = np.ascontiguousarray(words, dtype=np.int64).reshape(-1)
    m = v >> 63
    np.bitwise_xor(m, v, out=m)  # v >= 0: v; v < 0: -v - 1.  v fits in w bytes iff m < 2^(8w - 1)
    best_w, best_size, over = FULL, FULL * v.size, None
    for w in WIDTHS:  # narrower widths leave more exceptions: stop once the size grows
        out = m >= np.int64(1 << (8 * w - 1))
        size = w * v.size + EXCEPTION_BYTES * int(np.count_nonzero(out))
        if size > best_size:
            break
        best_w, best_size, over = w, size, out
    lo_bytes, hi_bytes = _parts(best_w)
    if best_w <= 4:
        lo, hi = v.astype(f"<i{best_w}"), np.zeros(0, np.uint8)  # wraps out-of-range words: exceptions restore them
    elif best_w < FULL:
        lo, hi = (v & _LOW).astype("<u4"), (v >> 32).astype(f"<i{hi_bytes}")
    else:
        lo, hi = v.astype("<i8"), np.zeros(0, np.uint8)
    xi = np.zeros(0, np.int64) if over is None else np.flatnonzero(over).astype(np.int64)
    return {f"{name}_nw": best_w, f"{name}_nlo": lo.view(np.uint8), f"{name}_nhi": hi.view(np.uint8),
            f"{name}_nxi": xi, f"{name}_nxv": v[xi]}


def stored_as_narrow(state: Mapping, name: str) -> bool:
    return f"{name}_nlo" in state


def wide(state: Mapping, name: str, size: int) -> np.ndarray:
    """The ``size`` int64 words ``narrow`` stored under ``name`` (ValueError on any inconsistency)."""
    w = int(state[f"{name}_nw"])
    lo, hi = np.asarray(state[f"{name}_nlo"]), np.asarray(state[f"{name}_nhi"])
    xi, xv = np.asarray(state[f"{name}_nxi"]), np.asarray(state[f"{name}_nxv"])
    lo_bytes, hi_bytes = _parts(w) if w in WIDTHS else (FULL, 0)
    if (w not in WIDTHS and w != FULL) or lo.dtype != np.uint8 or hi.dtype != np.uint8 \
            or lo.size != lo_bytes * size or hi.size != hi_bytes * size or xi.shape != xv.shape \
            or xi.dtype != np.int64 or xv.dtype != np.int64 or (xi.size and (xi.min() < 0 or xi.max() >= size)):
        raise ValueError(f"stored words {name!r} do not match the model's dimension, classes or type")
    if hi_bytes:
        v = hi.view(f"<i{hi_bytes}").astype(np.int64)
        v <<= 32
        v |= lo.view("<u4")
    else:
        v = lo.view(f"<i{lo_bytes}").astype(np.int64)
    v[xi] = xv
    return v


def narrow_all(state: dict, names: tuple[str, ...]) -> None:
    """Each array ``names`` of ``state`` replaced by its narrow form, in place (those absent left out)."""
    for name in names:
        if name in state:
            state.update(narrow(state.pop(name), name))


def wide_all(state: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> Mapping:
    """``state`` with each of ``shapes``'s names that is stored narrow read back as int64 words of that shape."""
    widened = {name: wide(state, name, int(np.prod(shape))).reshape(shape)
               for name, shape in shapes.items() if stored_as_narrow(state, name)}
    return {**state, **widened} if widened else state
