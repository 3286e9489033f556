"""The request of an operation (app/services/operations.py), stored sealed in chunks and shredded when it ends.

A bulk unlearn keeps the commitments of its record ids (never the ids) and, for a family whose forgets need the
records' features, the features the client sent; a large learn keeps the commitments and the checked examples.
Each chunk is sealed as the retained examples are (app/db/retained.py), under the operation's own random data key:

    operation_payloads.sealed = nonce (12) | AES-GCM(data key, msgpack(chunk), AAD) + tag (16)
    operations.wrapped_key    = Cipher.seal(data key, "operation-key", "<operation id>")
    AAD                       = b"olu:operation:<operation id>:<seq>"

A chunk's row is deleted in the transaction that applies it, and the wrapped key (with any chunk left) in the
transaction that ends the operation, however it ends: crypto-shredding, so a copy of a chunk left in a WAL frame,
a dead tuple or a backup cannot be opened once the operation is over (nor with the encryption key).
"""
from __future__ import annotations

import os
from typing import Any

import msgpack
import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import delete, insert, select, update

from ..crypto import DecryptionError
from .tables import Operation, OperationPayload

NONCE = 12
KEY = 32
PURPOSE = "operation-key"
_P, _O = OperationPayload.__table__, Operation.__table__


def _aad(operation_id: str, seq: int) -> bytes:
    return f"olu:operation:{operation_id}:{seq}".encode()


def new_data_key(cipher, operation_id: str) -> tuple[bytes, bytes]:
    """(data key, wrapped data key) for a new operation."""
    key = os.urandom(KEY)
    return key, cipher.seal(key, PURPOSE, operation_id)


def open_data_key(cipher, operation_id: str, wrapped: bytes | None) -> bytes:
    if wrapped is None:
        raise DecryptionError(f"the request of operation {operation_id} was shredded")
    key = cipher.open(wrapped, PURPOSE, operation_id)
    if len(key) != KEY:  # an unsealed value is never accepted as a key
        raise DecryptionError(f"operation key of {operation_id} is not a sealed data key")
    return key


def _pack(chunk: dict[str, Any]) -> bytes:
    def default(v):
        if isinstance(v, np.ndarray):
            return {"__nd__": v.dtype.str, "shape": list(v.shape), "data": np.ascontiguousarray(v).tobytes()}
        raise TypeError(f"cannot pack {type(v).__name__}")

    return msgpack.packb(chunk, default=default, use_bin_type=True)


def _unpack(raw: bytes) -> dict[str, Any]:
    def hook(d):
        if "__nd__" in d:
            return np.frombuffer(d["data"], dtype=np.dtype(d["__nd__"])).reshape(d["shape"]).copy()
        return d

    return msgpack.unpackb(raw, object_hook=hook, raw=False, strict_map_key=False)


def write_chunks(s, operation_id: str, data_key: bytes, chunks: list[dict[str, Any]]) -> None:
    rows = []
    for seq, chunk in enumerate(chunks):
        nonce = os.urandom(NONCE)
        rows.append({"operation_id": operation_id, "seq": seq,
                     "sealed": nonce + AESGCM(data_key).encrypt(nonce, _pack(chunk), _aad(operation_id, seq))})
    if rows:
        s.execute(insert(_P), rows)


def read_chunk(s, operation_id: str, data_key: bytes, seq: int) -> dict[str, Any] | None:
    """Chunk ``seq`` opened, or None when it is not there (applied already)."""
    sealed = s.execute(select(_P.c.sealed).where(_P.c.operation_id == operation_id, _P.c.seq == seq)).scalar()
    if sealed is None:
        return None
    sealed = bytes(sealed)
    try:
        plain = AESGCM(data_key).decrypt(sealed[:NONCE], sealed[NONCE:], _aad(operation_id, seq))
    except Exception:  # InvalidTag: never echo key bytes
        raise DecryptionError(f"chunk {seq} of operation {operation_id} does not authenticate") from None
    return _unpack(plain)


def drop_chunk(s, operation_id: str, seq: int) -> None:
    s.execute(delete(_P).where(_P.c.operation_id == operation_id, _P.c.seq == seq))


def shred(s, operation_id: str) -> int:
    """Destroy the operation's data key and every chunk left; the number of chunks deleted."""
    s.execute(update(_O).where(_O.c.id == operation_id).values(wrapped_key=None))
    return s.execute(delete(_P).where(_P.c.operation_id == operation_id)).rowcount


def reseal_keys(db, cipher) -> int:
    """Re-wrap the data key of every operation not yet ended under the active encryption key (app/db/reseal.py);
    each one only if it is still the one read (an operation that ended meanwhile has shredded it)."""
    with db.read() as s:
        rows = s.execute(select(_O.c.id, _O.c.wrapped_key).where(_O.c.wrapped_key.is_not(None))).all()
    n = 0
    for op_id, wrapped in rows:
        if cipher.key_id_in(wrapped) == cipher.active_key_id:
            continue
        fresh = cipher.seal(cipher.open(wrapped, PURPOSE, op_id), PURPOSE, op_id)
        with db.write() as s:
            n += s.execute(update(_O).where(_O.c.id == op_id, _O.c.wrapped_key == wrapped)
                           .values(wrapped_key=fresh)).rowcount
    return n
