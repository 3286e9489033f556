"""A model's secret state as stored: a sealed base and a log of sealed per-version deltas (issue 36 item 1).

``model_states`` holds the base: the packed state (app/db/state_codec.py) sealed under the service key at its own
``version``.  Each later version up to the model's may be one ``model_state_deltas`` row, of kind

* ``learn``: the batch the engine learned (``X``, ``y`` packed), for a family whose learn replays exactly
  (``Unlearner.learn_replays_exactly``: exact_ridge's integer sums): a 1-example learn at d = 1 439 stores ~12 kB
  instead of the 16.6 MB state;
* ``patch``: the changed pages of the packed state (``page_patch``), for the other families with a large state.

Each delta is sealed under its own random data key (AES-256-GCM, AAD ``olu:state-delta:<model>:<version>:<kind>``)
wrapped by the service key in ``model_state_delta_keys`` (purpose ``state-delta-key``): the layout of the retained
examples (app/db/retained.py), because a ``learn`` delta holds examples.  The registry (app/state_store.py) decides
what a write stores and rebuilds a version from the base and the deltas after it; ``rebase`` writes a new base and
deletes every delta and delta key in the writer's transaction (every forget and retrain, and a learn whose delta
would make the log too long: compaction), so a crash leaves either the old base and log or the new base, whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import bindparam, delete, insert, select, update

from ..crypto import DecryptionError
from .tables import ModelState, ModelStateDelta, ModelStateDeltaKey

PURPOSE = "state-delta-key"
KINDS = ("learn", "patch")
NONCE, KEY, TAG = 12, 32, 16

_S, _D, _K = ModelState.__table__, ModelStateDelta.__table__, ModelStateDeltaKey.__table__
_BASE = select(_S.c.version, _S.c.blob).where(_S.c.model_id == bindparam("mid"))
_DELTAS = (select(_D.c.version, _D.c.kind, _D.c.sealed, _K.c.wrapped)
           .select_from(_D.join(_K, (_K.c.model_id == _D.c.model_id) & (_K.c.version == _D.c.version)))
           .where(_D.c.model_id == bindparam("mid"), _D.c.version > bindparam("after")).order_by(_D.c.version))
_REBASE = update(_S).where(_S.c.model_id == bindparam("mid")).values(version=bindparam("version"),
                                                                        blob=bindparam("blob"))
_DROP_KEYS = delete(_K).where(_K.c.model_id == bindparam("mid"))
_DROP_DELTAS = delete(_D).where(_D.c.model_id == bindparam("mid"))


@dataclass
class Stored:
    """What the database holds of one model's state: the sealed base at ``base_version`` and the opened deltas
    after it, in version order, with the bytes they occupy."""
    base_version: int
    base: bytes
    deltas: list[tuple[int, str, bytes]] = field(default_factory=list)  # (version, kind, plaintext)
    delta_bytes: int = 0  # sealed deltas and wrapped keys, as stored


def _aad(model_id: str, version: int, kind: str) -> bytes:
    return f"olu:state-delta:{model_id}:{int(version)}:{kind}".encode()


def wrapped_size(cipher) -> int:
    return KEY if cipher is None else len(cipher.seal(bytes(KEY), PURPOSE, "size:0"))


def stored_size(plain_len: int, cipher) -> int:
    """The bytes one delta of ``plain_len`` plaintext bytes occupies (sealed row and wrapped key)."""
    return NONCE + int(plain_len) + TAG + wrapped_size(cipher)


def seal_delta(cipher, model_id: str, version: int, kind: str, plain: bytes) -> tuple[bytes, bytes]:
    rnd = os.urandom(KEY + NONCE)
    data_key, nonce = rnd[:KEY], rnd[KEY:]
    sealed = nonce + AESGCM(data_key).encrypt(nonce, plain, _aad(model_id, version, kind))
    wrapped = data_key if cipher is None else cipher.seal(data_key, PURPOSE, f"{model_id}:{int(version)}")
    return sealed, wrapped


def open_delta(cipher, model_id: str, version: int, kind: str, sealed: bytes, wrapped: bytes) -> bytes:
    data_key = bytes(wrapped) if cipher is None else cipher.open(wrapped, PURPOSE, f"{model_id}:{int(version)}")
    if len(data_key) != KEY:
        raise DecryptionError(f"state delta key of {model_id}:{version} is not a sealed data key")
    sealed = bytes(sealed)
    try:
        return AESGCM(data_key).decrypt(sealed[:NONCE], sealed[NONCE:], _aad(model_id, version, kind))
    except Exception:  # InvalidTag: never echo key bytes
        raise DecryptionError(f"state delta {model_id}:{version} does not authenticate") from None


def load(s, cipher, model_id: str) -> Stored:
    """The base and the opened deltas of ``model_id`` (NoResultFound without a base)."""
    conn = s.connection()
    version, blob = conn.execute(_BASE, {"mid": model_id}).one()
    out = Stored(int(version), bytes(blob))
    for v, kind, sealed, wrapped in conn.execute(_DELTAS, {"mid": model_id, "after": int(version)}):
        out.deltas.append((int(v), kind, open_delta(cipher, model_id, int(v), kind, sealed, wrapped)))
        out.delta_bytes += len(sealed) + len(wrapped)
    return out


def append(s, cipher, model_id: str, version: int, kind: str, plain: bytes) -> int:
    """Log version ``version`` of ``model_id`` as a delta; the bytes it occupies."""
    if kind not in KINDS:
        raise ValueError(f"unknown state delta kind {kind!r}")
    sealed, wrapped = seal_delta(cipher, model_id, version, kind, plain)
    conn = s.connection()
    conn.execute(insert(_K), [{"model_id": model_id, "version": int(version), "wrapped": wrapped}])
    conn.execute(insert(_D), [{"model_id": model_id, "version": int(version), "kind": kind, "sealed": sealed}])
    return len(sealed) + len(wrapped)


def rebase(s, model_id: str, version: int, blob: bytes, logged: int | None = None) -> int:
    """Store ``blob`` (sealed) as the base at ``version`` and destroy every delta and delta key of the model; the
    number of deltas destroyed.  ``logged``: how many the log holds when the caller knows it (0: nothing to do)."""
    conn = s.connection()
    conn.execute(_REBASE, {"mid": model_id, "version": int(version), "blob": blob})
    if logged == 0:
        return 0
    conn.execute(_DROP_KEYS, {"mid": model_id})
    return int(conn.execute(_DROP_DELTAS, {"mid": model_id}).rowcount or 0)


def erase(s, model_id: str) -> None:
    """Delete the model's base, deltas and delta keys (its erasure)."""
    conn = s.connection()
    conn.execute(_DROP_KEYS, {"mid": model_id})
    conn.execute(_DROP_DELTAS, {"mid": model_id})
    conn.execute(delete(_S).where(_S.c.model_id == model_id))
