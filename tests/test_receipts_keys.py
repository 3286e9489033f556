"""Ed25519 key ring: key ids, signing, loading (env / file / data dir), rotation, no private-key leaks."""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import pickle
import stat
import threading

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.receipts.canonical import receipt_signing_bytes
from app.receipts.keys import (KeyLoadError, KeyRing, PublicKeyEntry, SigningKey, b64decode_strict, key_id_for,
                               utc_now_iso, verify_with_public_keys)
from app.receipts.keystore import load_or_create_keyring, rotate_key

SEED = bytes(range(32))


def _secret_forms(seed: bytes) -> list[str]:
    sk = Ed25519PrivateKey.from_private_bytes(seed)
    pem = sk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption()).decode()
    body = "".join(pem.strip().splitlines()[1:-1])
    return [seed.hex(), base64.b64encode(seed).decode(), base64.urlsafe_b64encode(seed).decode().rstrip("="),
            body[:40], repr(seed)[2:-1]]


def _assert_no_secret(text: str, seed: bytes) -> None:
    for form in _secret_forms(seed):
        assert form not in text


def _seed_of_file(path) -> bytes:
    sk = serialization.load_pem_private_key(path.read_bytes(), password=None)
    return sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())


def test_key_id_is_sha256_prefix_of_raw_public_key():
    k = SigningKey.from_seed(SEED)
    raw = Ed25519PrivateKey.from_private_bytes(SEED).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert k.public_key_raw == raw
    assert k.key_id == hashlib.sha256(raw).hexdigest()[:16] == key_id_for(raw)
    assert base64.b64decode(k.public_key_b64) == raw


def test_sign_and_verify_standard_base64():
    k = SigningKey.from_seed(SEED)
    sig = k.sign(b"hello")
    assert len(b64decode_strict(sig)) == 64 and sig.endswith("=")
    assert k.verify(b"hello", sig)
    assert not k.verify(b"hellp", sig)
    raw = bytearray(base64.b64decode(sig))
    raw[10] ^= 1
    assert not k.verify(b"hello", base64.b64encode(bytes(raw)).decode())
    # non-canonical base64 of the same bytes, URL-safe alphabet, whitespace: all refused
    assert not k.verify(b"hello", sig.rstrip("="))
    assert not k.verify(b"hello", " " + sig)
    assert not k.verify(b"hello", sig.replace("+", "-").replace("/", "_") if ("+" in sig or "/" in sig)
                        else sig[:-3] + "x==")


def test_no_private_material_in_repr_str_public_keys_or_pickle():
    k = SigningKey.from_seed(SEED)
    ring = KeyRing(k)
    for text in (repr(k), str(k), repr(ring), str(ring), json.dumps(ring.public_keys())):
        _assert_no_secret(text, SEED)
    assert k.key_id in repr(k)
    with pytest.raises(TypeError):
        pickle.dumps(k)
    with pytest.raises(TypeError):
        pickle.dumps(ring)
    assert copy.deepcopy(k) is k
    assert not [n for n in dir(k) if not n.startswith("_") and "private" in n.lower()]
    entry = ring.public_keys()[0]
    assert set(entry) == {"key_id", "alg", "public_key", "not_before", "not_after", "status"}
    assert entry["alg"] == "Ed25519" and entry["status"] == "active"


def test_from_text_accepts_pem_and_base64_seed():
    pem = Ed25519PrivateKey.from_private_bytes(SEED).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    kid = SigningKey.from_seed(SEED).key_id
    assert SigningKey.from_text(pem.decode()).key_id == kid
    assert SigningKey.from_text(base64.b64encode(SEED).decode()).key_id == kid
    assert SigningKey.from_text(base64.urlsafe_b64encode(SEED).decode().rstrip("=") + "\n").key_id == kid
    for bad in ("not a key", base64.b64encode(SEED[:31]).decode(), "-----BEGIN PRIVATE KEY-----\nAAAA\n"):
        with pytest.raises(KeyLoadError) as ei:
            SigningKey.from_text(bad)
        _assert_no_secret(str(ei.value), SEED)


def test_first_start_creates_0600_key_and_reloads_same(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    ring = load_or_create_keyring(tmp_path)
    d = tmp_path / "signing-keys"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    pem = d / f"{ring.key_id}.pem"
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600
    assert stat.S_IMODE((d / "index.json").stat().st_mode) == 0o600
    seed = _seed_of_file(pem)
    assert SigningKey.from_seed(seed).key_id == ring.key_id
    index_text = (d / "index.json").read_text()
    _assert_no_secret(index_text + caplog.text + repr(ring) + json.dumps(ring.public_keys()), seed)
    assert ring.key_id in caplog.text
    again = load_or_create_keyring(tmp_path)
    assert again.key_id == ring.key_id
    assert again.public_keys() == ring.public_keys()


def test_concurrent_first_start_creates_one_key(tmp_path):
    rings, errors = [], []

    def go():
        try:
            rings.append(load_or_create_keyring(tmp_path))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    ts = [threading.Thread(target=go) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len({r.key_id for r in rings}) == 1
    assert len(list((tmp_path / "signing-keys").glob("*.pem"))) == 1


def test_rotation_keeps_old_receipts_verifiable(tmp_path):
    r1 = load_or_create_keyring(tmp_path)
    issued = utc_now_iso()
    receipt = r1.sign_receipt({"id": "a", "issued_at": issued})
    assert receipt["key_id"] == r1.key_id
    r2 = rotate_key(tmp_path, now="2030-06-01T00:00:00Z")
    assert r2.key_id != r1.key_id
    keys = {k["key_id"]: k for k in r2.public_keys()}
    assert keys[r1.key_id]["status"] == "retired" and keys[r1.key_id]["not_after"] == "2030-06-01T00:00:00Z"
    assert keys[r2.key_id]["status"] == "active" and keys[r2.key_id]["not_before"] == "2030-06-01T00:00:00Z"
    assert r2.public_keys()[0]["key_id"] == r2.key_id
    msg = receipt_signing_bytes(receipt)
    assert r2.verify(r1.key_id, msg, receipt["signature"])                                # retired key verifies
    assert r2.verify(r1.key_id, msg, receipt["signature"], at=issued)
    assert not r2.verify(r1.key_id, msg, receipt["signature"], at="2000-01-01T00:00:00Z")  # before creation
    assert not r2.verify(r1.key_id, msg, receipt["signature"], at="2030-07-01T00:00:00Z")  # after retirement
    assert verify_with_public_keys(r2.public_keys(), r1.key_id, msg, receipt["signature"])
    assert not r2.verify("0000000000000000", msg, receipt["signature"])                  # unknown key id
    assert not verify_with_public_keys(r2.public_keys(), "0000000000000000", msg, receipt["signature"])
    assert not r2.verify(r2.key_id, msg, receipt["signature"])                           # wrong key
    new = r2.sign_receipt({"id": "b"})
    assert new["key_id"] == r2.key_id and r2.verify(r2.key_id, receipt_signing_bytes(new), new["signature"])
    assert not r1.verify(r2.key_id, receipt_signing_bytes(new), new["signature"])        # old ring: unknown
    # reload from disk sees the same ring
    r3 = load_or_create_keyring(tmp_path)
    assert r3.key_id == r2.key_id and r3.public_keys() == r2.public_keys()
    r4 = rotate_key(tmp_path, delete_old_private=True)
    assert not (tmp_path / "signing-keys" / f"{r2.key_id}.pem").exists()
    assert r4.verify(r1.key_id, msg, receipt["signature"])
    assert len(r4.public_keys()) == 3


def test_env_key_and_key_file_take_precedence(tmp_path):
    disk = load_or_create_keyring(tmp_path)
    old = disk.sign_receipt({"id": "x"})
    env_ring = load_or_create_keyring(tmp_path, env_key=base64.b64encode(SEED).decode())
    assert env_ring.key_id == SigningKey.from_seed(SEED).key_id
    # the data-dir key becomes a retired verification key
    assert env_ring.verify(disk.key_id, receipt_signing_bytes(old), old["signature"])
    statuses = {k["key_id"]: k["status"] for k in env_ring.public_keys()}
    assert statuses == {env_ring.key_id: "active", disk.key_id: "retired"}
    f = tmp_path / "k.pem"
    other = Ed25519PrivateKey.generate()
    f.write_bytes(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    f.chmod(0o600)
    file_ring = load_or_create_keyring(tmp_path, env_key=None, key_file=f)
    assert file_ring.key_id == key_id_for(other.public_key().public_bytes(serialization.Encoding.Raw,
                                                                          serialization.PublicFormat.Raw))
    assert load_or_create_keyring(tmp_path, env_key=base64.b64encode(SEED).decode(), key_file=f).key_id == \
        env_ring.key_id


def test_public_key_entry_rejects_mismatched_key_id():
    k = SigningKey.from_seed(SEED)
    d = KeyRing(k).public_keys()[0]
    assert PublicKeyEntry.from_dict(d).key_id == k.key_id
    with pytest.raises(KeyLoadError):
        PublicKeyEntry.from_dict(dict(d, key_id="ffffffffffffffff"))
    with pytest.raises(KeyLoadError):
        PublicKeyEntry.from_dict(dict(d, alg="RSA"))
    # a list entry whose key id lies about its key is ignored, so verification fails
    msg, sig = b"m", k.sign(b"m")
    forged = dict(d, key_id="ffffffffffffffff")
    assert not verify_with_public_keys([forged], "ffffffffffffffff", msg, sig)
    assert verify_with_public_keys([forged, d], k.key_id, msg, sig)


def test_rotation_grace_period_and_stale_tmp_file(tmp_path):
    r1 = load_or_create_keyring(tmp_path)
    (tmp_path / "signing-keys" / f".index.json.{__import__('os').getpid()}.tmp").write_text("crash leftover")
    r2 = rotate_key(tmp_path, now="2030-01-01T00:00:00Z", grace_seconds=600)
    old = {k["key_id"]: k for k in r2.public_keys()}[r1.key_id]
    assert old["not_after"] == "2030-01-01T00:10:00.000000Z"  # microsecond precision, like issued_at
    receipt = r1.sign_receipt({"id": "late", "issued_at": "2030-01-01T00:05:00Z"})   # issued by a stale process
    msg = receipt_signing_bytes(receipt)
    assert r2.verify(r1.key_id, msg, receipt["signature"], at=receipt["issued_at"])
    assert not r2.verify(r1.key_id, msg, receipt["signature"], at="2030-01-01T00:10:01Z")
    # RFC 3339 with microseconds (the service's issued_at spelling) compares as a time, not as text
    assert r2.verify(r1.key_id, msg, receipt["signature"], at="2030-01-01T00:09:59.999999Z")
    assert not r2.verify(r1.key_id, msg, receipt["signature"], at="2030-01-01T00:10:00.000001Z")
    with pytest.raises(TypeError):
        r2._entries["x"] = None  # the ring is read-only after load
