"""Signed checkpoints (signed tree heads) of a tenant's Merkle log.

A checkpoint is the JSON object ::

    {"origin": "olu/<tenant_id>", "tree_size": 42, "root_hash": "<base64 32 bytes>",
     "timestamp": "2026-11-21T11:16:14Z", "key_id": "<16 hex>", "signature": "<base64 64 bytes>"}

The Ed25519 signature covers the UTF-8 bytes of a C2SP ``tlog-checkpoint``-style note body ::

    <origin>\\n<tree_size in decimal>\\n<base64 root hash>\\n<timestamp>\\n

(the timestamp is the first extension line).  :func:`checkpoint_note` renders the same checkpoint as a signed
note text (``— <origin> <base64(4-byte key hash || signature)>``) whose signature is identical, for tools
that speak the Go ``note`` format.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from .keys import (PublicKeyEntry, b64decode_strict, b64encode, parse_utc, verify_with_public_keys)
from .merkle import HASH_SIZE

__all__ = ["receipt_proof", "proof_member", "checkpoint_body", "make_checkpoint", "verify_checkpoint", "checkpoint_problems",
           "checkpoint_note", "tenant_origin"]


def tenant_origin(tenant_id: str) -> str:
    """Log origin string for a tenant: ``olu/<tenant_id>``."""
    return f"olu/{tenant_id}"


def _timestamp_str(ts: str | datetime) -> str:
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=timezone.utc)
        return ts.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ts


def checkpoint_body(origin: str, tree_size: int, root_hash_b64: str, timestamp: str) -> bytes:
    """The signed note body; raises ``ValueError`` for fields that would break the line format."""
    for name, v in (("origin", origin), ("timestamp", timestamp), ("root_hash", root_hash_b64)):
        if not isinstance(v, str) or not v or "\n" in v or "\r" in v:
            raise ValueError(f"checkpoint {name} must be a non-empty single-line string")
    if isinstance(tree_size, bool) or not isinstance(tree_size, int) or tree_size < 0:
        raise ValueError("checkpoint tree_size must be a non-negative integer")
    return f"{origin}\n{tree_size}\n{root_hash_b64}\n{timestamp}\n".encode("utf-8")


def make_checkpoint(origin: str, tree_size: int, root_hash: bytes, timestamp: str | datetime,
                    keyring: Any) -> dict[str, Any]:
    """Sign a checkpoint with the key ring's active key (``keyring.sign(bytes) -> (key_id, sig)``)."""
    if len(root_hash) != HASH_SIZE:
        raise ValueError("root_hash must be 32 bytes")
    ts = _timestamp_str(timestamp)
    parse_utc(ts)  # ValueError if not ISO-8601
    root_b64 = b64encode(root_hash)
    key_id, sig = keyring.sign(checkpoint_body(origin, tree_size, root_b64, ts))
    return {"origin": origin, "tree_size": tree_size, "root_hash": root_b64, "timestamp": ts,
            "key_id": key_id, "signature": sig}


def checkpoint_problems(cp: Any, public_keys: Iterable[Mapping[str, Any] | PublicKeyEntry]) -> list[str]:
    """Why ``cp`` does not verify (empty list = valid)."""
    if not isinstance(cp, Mapping):
        return ["checkpoint is not an object"]
    missing = [k for k in ("origin", "tree_size", "root_hash", "timestamp", "key_id", "signature") if k not in cp]
    if missing:
        return [f"checkpoint lacks {', '.join(missing)}"]
    try:
        body = checkpoint_body(cp["origin"], cp["tree_size"], cp["root_hash"], cp["timestamp"])
        if len(b64decode_strict(cp["root_hash"])) != HASH_SIZE:
            return ["root_hash is not 32 bytes"]
    except ValueError as exc:
        return [str(exc)]
    try:
        parse_utc(cp["timestamp"])
        at = cp["timestamp"]
    except ValueError:
        return ["timestamp is not ISO-8601"]
    if not isinstance(cp["key_id"], str) or not isinstance(cp["signature"], str):
        return ["key_id and signature must be strings"]
    if not verify_with_public_keys(list(public_keys), cp["key_id"], body, cp["signature"], at=at):
        return [f"signature does not verify under trusted key {cp['key_id']!r} at {at}"]
    return []


def verify_checkpoint(cp: Any, public_keys: Iterable[Mapping[str, Any] | PublicKeyEntry]) -> bool:
    """True iff the checkpoint is well-formed and signed by a trusted key valid at its timestamp."""
    return not checkpoint_problems(cp, public_keys)


def checkpoint_note(cp: Mapping[str, Any], public_key_b64: str) -> str:
    """Render as a Go/C2SP signed note; signer name = origin, key hash per ``golang.org/x/mod/sumdb/note``."""
    body = checkpoint_body(cp["origin"], cp["tree_size"], cp["root_hash"], cp["timestamp"]).decode()
    pk = b64decode_strict(public_key_b64)
    key_hash = hashlib.sha256(cp["origin"].encode() + b"\n" + b"\x01" + pk).digest()[:4]
    sig = b64decode_strict(cp["signature"])
    return f"{body}\n\u2014 {cp['origin']} {b64encode(key_hash + sig)}\n"


def receipt_proof(log: Any, leaf_index: int, checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The ``proof`` member of a served receipt: audit path of ``leaf_index`` in the checkpoint's tree.

    ``log`` is a :class:`app.receipts.merkle.MerkleLog`; the checkpoint must be for the same log and a size
    greater than ``leaf_index``.
    """
    return proof_member(leaf_index, log.inclusion_proof(leaf_index, checkpoint["tree_size"]), checkpoint)


def proof_member(leaf_index: int, hashes: list[bytes], checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The ``proof`` member from an audit path already computed against ``checkpoint`` (leaf to root)."""
    return {"leaf_index": leaf_index, "tree_size": checkpoint["tree_size"], "hashes": [b64encode(h) for h in hashes],
            "checkpoint": dict(checkpoint)}
