"""Receipts and the per-tenant transparency log: pure, storage-agnostic core (no SQL, no web framework).

* :mod:`.canonical` — RFC 8785 canonical JSON, signed bytes, leaf bytes, parameter hash.
* :mod:`.keys` — Ed25519 signing keys, key ring, rotation, on-disk key storage.
* :mod:`.merkle` — RFC 6962 Merkle log over a ``NodeStore`` (level, index) -> hash, proofs, verification.
* :mod:`.checkpoint` — signed checkpoints (C2SP-style note body).
* :mod:`.verify` — offline bundle verifier (also ``python -m app.receipts.verify``).
"""
from .canonical import (CanonicalJSONError, canonical_json, parameters_sha256, receipt_leaf_bytes,
                        receipt_signing_bytes)
from .checkpoint import make_checkpoint, receipt_proof, tenant_origin, verify_checkpoint
from .keys import KeyRing, SigningKey
from .keystore import load_or_create_keyring, rotate_key
from .merkle import (EMPTY_ROOT, InMemoryNodeStore, MerkleLog, NodeStore, leaf_hash, node_hash,
                     verify_consistency, verify_inclusion)
from .verify import VerificationReport, verify_bundle

__all__ = [
    "CanonicalJSONError", "canonical_json", "parameters_sha256", "receipt_leaf_bytes", "receipt_signing_bytes",
    "make_checkpoint", "receipt_proof", "tenant_origin", "verify_checkpoint",
    "KeyRing", "SigningKey", "load_or_create_keyring", "rotate_key",
    "EMPTY_ROOT", "InMemoryNodeStore", "MerkleLog", "NodeStore", "leaf_hash", "node_hash",
    "verify_consistency", "verify_inclusion",
    "VerificationReport", "verify_bundle",
]
