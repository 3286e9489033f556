"""Encryption at rest for secret state (engine state blobs, tenant record keys): AES-256-GCM.

Sealed blob layout (all of it is stored in the database column)::

    b"OLUE" | version byte (1) | key id (8 bytes) | nonce (12 random bytes) | ciphertext + 16-byte tag

* The key id is the first 8 bytes of SHA-256("olu-encryption-key-id" || key): it names the key without
  revealing it, so blobs written under an older key still decrypt after a rotation as long as that key is
  listed in ``OLU_ENCRYPTION_KEYS_OLD``.  New blobs are always sealed with the active key.
* The AAD binds a blob to its owner (``purpose`` + ``owner id``, e.g. the model id): a state blob copied onto
  another model's row, or a tenant's record key onto another tenant, fails authentication.
* A value without the ``OLUE`` prefix is a legacy plaintext value (written before encryption existed); it is
  read as is and sealed on its next write.

The active key comes from ``OLU_ENCRYPTION_KEY`` (base64 of 32 bytes); when unset it is generated on first
start into ``<data_dir>/encryption.key`` (mode 0600, created atomically so that replicas starting together
on one data directory agree on it).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from pathlib import Path
from typing import Iterable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"OLUE"
VERSION = 1
KEY_ID_LEN = 8
NONCE_LEN = 12
HEADER_LEN = len(MAGIC) + 1 + KEY_ID_LEN + NONCE_LEN
TAG_LEN = 16  # AES-GCM's authentication tag, after the ciphertext
KEY_FILE = "encryption.key"


class DecryptionError(ValueError):
    """A sealed value cannot be opened (unknown key id, wrong owner, or tampered).  Never carries key bytes."""


def key_id_of(key: bytes) -> bytes:
    return hashlib.sha256(b"olu-encryption-key-id" + key).digest()[:KEY_ID_LEN]


def parse_key(text: str) -> bytes:
    """Base64 (standard or URL-safe, padding optional) of exactly 32 bytes."""
    data = text.strip().replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("encryption key must be base64 of 32 bytes") from None
    if len(raw) != 32:
        raise ValueError("encryption key must be base64 of 32 bytes")
    return raw


class Cipher:
    """AES-256-GCM with one active key and any number of older keys kept for decryption."""

    def __init__(self, active: bytes, old: Iterable[bytes] = ()):
        self._active_id = key_id_of(active)
        self._keys = {key_id_of(k): AESGCM(k) for k in old}
        self._keys[self._active_id] = AESGCM(active)

    def __repr__(self) -> str:
        return f"Cipher(active_key_id={self._active_id.hex()!r}, keys={len(self._keys)})"

    def __reduce__(self):  # never serialise key material by accident
        raise TypeError("Cipher cannot be pickled")

    @property
    def active_key_id(self) -> str:
        return self._active_id.hex()

    @staticmethod
    def _aad(purpose: str, owner: str) -> bytes:
        return f"olu:{purpose}:{owner}".encode()

    def seal(self, plaintext: bytes, purpose: str, owner: str) -> bytes:
        nonce = secrets.token_bytes(NONCE_LEN)
        ct = self._keys[self._active_id].encrypt(nonce, bytes(plaintext), self._aad(purpose, owner))
        return MAGIC + bytes([VERSION]) + self._active_id + nonce + ct

    def seal_large(self, plaintext: bytes, purpose: str, owner: str) -> bytearray:
        """``seal``'s layout, encrypted straight into one buffer after its header: a large value (a model state of
        8 MiB) is not copied once more to put the header in front (a bytearray: the database drivers store it as
        they store bytes)."""
        nonce = secrets.token_bytes(NONCE_LEN)
        out = bytearray(HEADER_LEN + len(plaintext) + TAG_LEN)
        out[:HEADER_LEN] = MAGIC + bytes([VERSION]) + self._active_id + nonce
        self._keys[self._active_id].encrypt_into(nonce, plaintext, self._aad(purpose, owner),
                                                 memoryview(out)[HEADER_LEN:])
        return out

    def open(self, blob: bytes, purpose: str, owner: str) -> bytes:
        blob = bytes(blob)
        if not is_sealed(blob):
            return blob  # legacy plaintext, sealed on its next write
        if blob[4] != VERSION or len(blob) < HEADER_LEN + 16:
            raise DecryptionError("unsupported or truncated sealed value")
        kid = blob[5 : 5 + KEY_ID_LEN]
        aes = self._keys.get(kid)
        if aes is None:
            raise DecryptionError(f"no encryption key with id {kid.hex()} (add it to OLU_ENCRYPTION_KEYS_OLD)")
        nonce = blob[5 + KEY_ID_LEN : HEADER_LEN]
        try:
            return aes.decrypt(nonce, blob[HEADER_LEN:], self._aad(purpose, owner))
        except InvalidTag:
            raise DecryptionError(f"sealed {purpose} value does not authenticate for {owner}") from None

    def key_id_in(self, blob: bytes) -> str | None:
        return bytes(blob)[5 : 5 + KEY_ID_LEN].hex() if is_sealed(blob) else None


def is_sealed(blob: bytes) -> bool:
    return bytes(blob[: len(MAGIC)]) == MAGIC


def _load_or_create_key_file(data_dir: Path) -> bytes:
    path = Path(data_dir) / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, base64.b64encode(secrets.token_bytes(32)) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic and never overwrites: a replica that lost the race reads the winner's key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return parse_key(path.read_text())


def load_cipher(data_dir: Path, active: str | None, old: str | None) -> Cipher:
    """The active key from settings (or the data dir), plus comma-separated older keys for decryption."""
    key = parse_key(active) if active and active.strip() else _load_or_create_key_file(Path(data_dir))
    olds = [parse_key(k) for k in (old or "").split(",") if k.strip()]
    return Cipher(key, olds)
