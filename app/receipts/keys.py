"""Ed25519 signing keys for receipts and checkpoints (``cryptography``), and a key ring with rotation.

Conventions (part of the public contract):

* **key id** = the first 16 hex characters (64 bits) of ``SHA-256(raw 32-byte Ed25519 public key)``.
  Deterministic, so anyone holding the public key can recompute it.
* **Encoding** of public keys and signatures: *standard* base64 with padding (RFC 4648 §4), the same
  encoding C2SP checkpoints use for root hashes and signatures.  Decoding is strict: only the canonical
  encoding of the bytes is accepted (no whitespace, no URL-safe alphabet, no non-zero padding bits).
* **Validity**: ``not_before`` / ``not_after`` are ISO-8601 UTC strings (``2026-11-21T11:16:14Z``) or ``None``
  (open).  A retired key still verifies what it signed while it was active; a verifier that knows the
  signing time (a receipt's ``issued_at``) can pass it as ``at`` to also check the window.

On-disk layout (when no key is supplied by environment or file)::

    <data_dir>/signing-keys/            mode 0700
        <key_id>.pem                    PKCS#8 PEM, unencrypted, mode 0600 (one per key ever generated)
        index.json                      mode 0600: {"version": 1, "keys": [{key_id, file, public_key,
                                        not_before, not_after, status: "active"|"retired"}]}
        .lock                           flock(2) lock serialising first-start creation and rotation

Private key material is never logged, never part of ``repr``/``str``, never returned by any public function
here, and ``SigningKey`` refuses to be pickled.  A loaded :class:`KeyRing` is immutable, so one instance can
be shared across threads of a web process (``cryptography`` Ed25519 signing is thread-safe).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "ALG",
    "KeyLoadError",
    "SigningKey",
    "PublicKeyEntry",
    "KeyRing",
    "key_id_for",
    "b64encode",
    "b64decode_strict",
    "utc_now_iso",
    "parse_utc",
    "verify_with_public_keys",
    "KEYS_DIRNAME",
]
# loading, first-start creation and rotation of the ring in the data directory: keystore.py

log = logging.getLogger(__name__)

ALG = "Ed25519"
KEYS_DIRNAME = "signing-keys"
_INDEX = "index.json"
_LOCK = ".lock"


class KeyLoadError(ValueError):
    """A key could not be loaded or is inconsistent (message never contains key material)."""


# -- encodings and times ------------------------------------------------------------------------------------

def b64encode(data: bytes) -> str:
    """Standard base64 with padding."""
    return base64.b64encode(bytes(data)).decode("ascii")


def b64decode_strict(text: str) -> bytes:
    """Decode standard padded base64, accepting only the canonical encoding; raises ``ValueError``."""
    if not isinstance(text, str):
        raise ValueError("base64 value must be a string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError("invalid base64") from exc
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError("non-canonical base64")
    return raw


def key_id_for(public_key_raw: bytes) -> str:
    """First 16 hex chars of SHA-256 of the raw 32-byte Ed25519 public key."""
    if len(public_key_raw) != 32:
        raise KeyLoadError("an Ed25519 public key is 32 bytes")
    return hashlib.sha256(bytes(public_key_raw)).hexdigest()[:16]


def utc_now_iso() -> str:
    # microseconds, like receipts' issued_at: a validity bound truncated to the second would put a receipt
    # signed earlier in the same second after its key's not_after
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_utc(text: str) -> datetime:
    """Parse an ISO-8601 timestamp; naive values are taken as UTC.  ``ValueError`` for anything else."""
    if not isinstance(text, str):
        raise ValueError("timestamp must be an ISO-8601 string")
    dt = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _raw_public(pk: Ed25519PublicKey) -> bytes:
    return pk.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# -- signing key ---------------------------------------------------------------------------------------------

class SigningKey:
    """An Ed25519 private key.  Exposes only its key id, public key and ``sign``."""

    __slots__ = ("_sk", "_pk_raw", "_key_id")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise KeyLoadError("signing keys must be Ed25519")
        self._sk = private_key
        self._pk_raw = _raw_public(private_key.public_key())
        self._key_id = key_id_for(self._pk_raw)

    @classmethod
    def generate(cls) -> "SigningKey":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> "SigningKey":
        if len(seed) != 32:
            raise KeyLoadError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @classmethod
    def from_pem(cls, pem: bytes) -> "SigningKey":
        try:
            sk = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError):
            raise KeyLoadError("cannot load the PEM private key (expect unencrypted PKCS#8 Ed25519)") from None
        if not isinstance(sk, Ed25519PrivateKey):
            raise KeyLoadError("the PEM private key is not Ed25519")
        return cls(sk)

    @classmethod
    def from_text(cls, text: str | bytes) -> "SigningKey":
        """PEM (PKCS#8) or base64 (standard or URL-safe, padding optional) of the raw 32-byte seed."""
        try:
            data = text.encode("ascii", "strict") if isinstance(text, str) else bytes(text)
        except UnicodeEncodeError:
            raise KeyLoadError("signing key text must be ASCII (PEM or base64)") from None
        data = data.strip()
        if data.startswith(b"-----BEGIN"):
            return cls.from_pem(data)
        compact = data.replace(b"-", b"+").replace(b"_", b"/")
        compact += b"=" * (-len(compact) % 4)
        try:
            seed = base64.b64decode(compact, validate=True)
        except binascii.Error:
            raise KeyLoadError("signing key is neither PEM nor base64 of a 32-byte seed") from None
        return cls.from_seed(seed)

    @property
    def key_id(self) -> str:
        return self._key_id

    @property
    def public_key_raw(self) -> bytes:
        return self._pk_raw

    @property
    def public_key_b64(self) -> str:
        return b64encode(self._pk_raw)

    def sign(self, message: bytes) -> str:
        """Ed25519 signature of ``message``, standard base64."""
        return b64encode(self._sk.sign(bytes(message)))

    def verify(self, message: bytes, signature_b64: str) -> bool:
        return _verify_raw(self._pk_raw, message, signature_b64)

    def _private_pem(self) -> bytes:
        """PKCS#8 PEM, for writing the key file only (module-private)."""
        return self._sk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    def __repr__(self) -> str:
        return f"SigningKey(key_id={self._key_id!r}, alg='Ed25519')"

    __str__ = __repr__

    def __reduce__(self):  # never serialise private material by accident
        raise TypeError("SigningKey cannot be pickled")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def _verify_raw(public_key_raw: bytes, message: bytes, signature_b64: str) -> bool:
    try:
        sig = b64decode_strict(signature_b64)
        if len(sig) != 64:
            return False
        Ed25519PublicKey.from_public_bytes(bytes(public_key_raw)).verify(sig, bytes(message))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


# -- public keys and the ring -------------------------------------------------------------------------------

@dataclass(frozen=True)
class PublicKeyEntry:
    key_id: str
    public_key_raw: bytes
    not_before: str | None = None
    not_after: str | None = None
    status: str = "retired"

    def as_dict(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "alg": ALG, "public_key": b64encode(self.public_key_raw),
                "not_before": self.not_before, "not_after": self.not_after, "status": self.status}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PublicKeyEntry":
        if d.get("alg", ALG) != ALG:
            raise KeyLoadError(f"unsupported key algorithm {d.get('alg')!r}")
        try:
            raw = b64decode_strict(d["public_key"])
        except (KeyError, ValueError):
            raise KeyLoadError("public_key must be standard base64 of 32 bytes") from None
        kid = key_id_for(raw)
        if d.get("key_id", kid) != kid:
            raise KeyLoadError(f"key_id {d.get('key_id')!r} does not match its public key ({kid})")
        return cls(kid, raw, d.get("not_before"), d.get("not_after"), d.get("status", "retired"))

    def valid_at(self, at: str | None) -> bool:
        if at is None:
            return True
        t = parse_utc(at)
        if self.not_before is not None and t < parse_utc(self.not_before):
            return False
        if self.not_after is not None and t > parse_utc(self.not_after):
            return False
        return True

    def verify(self, message: bytes, signature_b64: str, at: str | None = None) -> bool:
        """The signature is this key's and (with ``at``) was made inside its validity window; a malformed
        ``at`` is a failure, not an error."""
        try:
            if not self.valid_at(at):
                return False
        except (ValueError, TypeError):
            return False
        return _verify_raw(self.public_key_raw, message, signature_b64)


def verify_with_public_keys(public_keys: Iterable[Mapping[str, Any] | PublicKeyEntry], key_id: str,
                            message: bytes, signature_b64: str, at: str | None = None) -> bool:
    """Verify a signature against a list of ``/v1/keys``-style dicts (or entries) by key id.

    False for an unknown key id, a malformed key or signature, or (with ``at``) a time outside the key's
    validity window.
    """
    for k in public_keys:
        try:
            entry = k if isinstance(k, PublicKeyEntry) else PublicKeyEntry.from_dict(k)
        except (KeyLoadError, AttributeError, TypeError):
            continue
        if entry.key_id == key_id:
            return entry.verify(message, signature_b64, at)
    return False


class KeyRing:
    """One active signing key plus retired public keys.  Immutable after construction."""

    __slots__ = ("_active", "_entries")

    def __init__(self, active: SigningKey, *, active_not_before: str | None = None,
                 retired: Iterable[PublicKeyEntry] = ()) -> None:
        entries = {active.key_id: PublicKeyEntry(active.key_id, active.public_key_raw, active_not_before, None,
                                                 "active")}
        for e in retired:
            if e.key_id == active.key_id:
                continue
            entries[e.key_id] = PublicKeyEntry(e.key_id, e.public_key_raw, e.not_before, e.not_after, "retired")
        self._active = active
        self._entries: Mapping[str, PublicKeyEntry] = MappingProxyType(entries)

    @property
    def active(self) -> SigningKey:
        return self._active

    @property
    def key_id(self) -> str:
        """Key id of the active signing key."""
        return self._active.key_id

    def sign(self, message: bytes) -> tuple[str, str]:
        """Sign with the active key; returns ``(key_id, base64 signature)``."""
        return self._active.key_id, self._active.sign(message)

    def sign_receipt(self, receipt: Mapping[str, Any]) -> dict[str, Any]:
        """Return a copy of ``receipt`` with ``key_id`` set to the active key and ``signature`` added.

        The signature covers :func:`app.receipts.canonical.receipt_signing_bytes` (which includes ``key_id``).
        """
        from .canonical import receipt_signing_bytes

        out = {k: v for k, v in receipt.items() if k not in ("signature", "proof")}
        out["key_id"] = self._active.key_id
        out["signature"] = self._active.sign(receipt_signing_bytes(out))
        return out

    def verify(self, key_id: str, message: bytes, signature_b64: str, at: str | None = None) -> bool:
        entry = self._entries.get(key_id)
        return entry is not None and entry.verify(message, signature_b64, at)

    def public_keys(self) -> list[dict[str, Any]]:
        """Entries for ``GET /v1/keys``: active first, then retired by key id."""
        es = sorted(self._entries.values(), key=lambda e: (e.status != "active", e.not_before or "", e.key_id))
        return [e.as_dict() for e in es]

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._entries

    def __repr__(self) -> str:
        return f"KeyRing(active={self._active.key_id!r}, keys={sorted(self._entries)!r})"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("KeyRing cannot be pickled")
