"""The signing key ring in the data directory: loading, first-start creation and rotation (layout: keys.py's
module docstring).  Creation and rotation are serialised between processes with flock(2) on ``.lock``."""
from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from .keys import (KEYS_DIRNAME, KeyLoadError, KeyRing, PublicKeyEntry, SigningKey, _INDEX, _LOCK, parse_utc,
                   utc_now_iso)

try:  # POSIX advisory locks; on other platforms creation/rotation are not serialised between processes
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["load_or_create_keyring", "rotate_key"]

log = logging.getLogger("app.receipts.keys")


# -- loading, first-start creation, rotation ----------------------------------------------------------------

def _keys_dir(data_dir: Path) -> Path:
    d = Path(data_dir) / KEYS_DIRNAME
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        os.chmod(d, 0o700)
    return d


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(d / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _write_private(path: Path, data: bytes) -> None:
    """Atomically write ``data`` to ``path`` with mode 0600 (temp file + fsync + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):  # left over by a crash; callers hold the directory lock
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _read_index(d: Path) -> list[dict[str, Any]]:
    p = d / _INDEX
    if not p.exists():
        return []
    doc = json.loads(p.read_text("utf-8"))
    if doc.get("version") != 1 or not isinstance(doc.get("keys"), list):
        raise KeyLoadError(f"unsupported key index format in {p}")
    return doc["keys"]


def _write_index(d: Path, keys: list[dict[str, Any]]) -> None:
    _write_private(d / _INDEX, json.dumps({"version": 1, "keys": keys}, indent=2, sort_keys=True).encode())


def _new_key_file(d: Path) -> tuple[SigningKey, str]:
    sk = SigningKey.generate()
    name = f"{sk.key_id}.pem"
    _write_private(d / name, sk._private_pem())
    log.info("generated Ed25519 signing key %s", sk.key_id)
    return sk, name


def _ring_from_index(d: Path, index: list[dict[str, Any]]) -> KeyRing:
    active = [e for e in index if e.get("status") == "active"]
    if len(active) != 1:
        raise KeyLoadError(f"key index {d / _INDEX} must have exactly one active key, has {len(active)}")
    a = active[0]
    sk = SigningKey.from_pem((d / a["file"]).read_bytes())
    if sk.key_id != a["key_id"]:
        raise KeyLoadError(f"key file {a['file']} does not hold key {a['key_id']}")
    retired = [PublicKeyEntry.from_dict(e) for e in index if e is not a]
    return KeyRing(sk, active_not_before=a.get("not_before"), retired=retired)


def _retired_from_index(data_dir: Path | None) -> list[PublicKeyEntry]:
    if data_dir is None:
        return []
    d = Path(data_dir) / KEYS_DIRNAME
    if not (d / _INDEX).exists():
        return []
    return [PublicKeyEntry.from_dict({**e, "status": "retired"}) for e in _read_index(d)]


def load_or_create_keyring(data_dir: Path, env_key: str | None = None, key_file: Path | None = None) -> KeyRing:
    """Load the service key ring.

    Precedence: ``env_key`` (PEM PKCS#8 or base64 of the 32-byte seed; e.g. ``OLU_SIGNING_KEY``), then
    ``key_file`` (same formats), then ``<data_dir>/signing-keys/`` which is created with a fresh key on
    first start.  With an env or file key, any keys listed in ``<data_dir>/signing-keys/index.json`` other
    than that key are added as *retired* public keys, so receipts signed before switching still verify.
    """
    if env_key is not None and env_key.strip():
        sk = SigningKey.from_text(env_key)
        return KeyRing(sk, retired=_retired_from_index(data_dir))
    if key_file is not None:
        key_file = Path(key_file)
        mode = key_file.stat().st_mode
        if mode & 0o077:
            log.warning("signing key file %s is readable by group/others (mode %o)", key_file, mode & 0o777)
        sk = SigningKey.from_text(key_file.read_bytes())
        return KeyRing(sk, retired=_retired_from_index(data_dir))
    d = _keys_dir(Path(data_dir))
    with _locked(d):
        index = _read_index(d)
        if not index:
            sk, name = _new_key_file(d)
            index = [{"key_id": sk.key_id, "file": name, "public_key": sk.public_key_b64,
                      "not_before": utc_now_iso(), "not_after": None, "status": "active"}]
            _write_index(d, index)
        return _ring_from_index(d, index)


def rotate_key(data_dir: Path, *, delete_old_private: bool = False, now: str | None = None,
               grace_seconds: int = 0) -> KeyRing:
    """Generate a new active key in ``<data_dir>/signing-keys/`` and retire the current one.

    The new key gets ``not_before = now``; the retired key gets ``not_after = now + grace_seconds`` and stays
    in the index (public key), so it keeps verifying the receipts it signed.  Processes that loaded the old
    ring keep signing with the old key until they reload: give them ``grace_seconds`` to do so, or receipts
    they issue after ``not_after`` fail the verifier's key-validity check.  The old PEM file is kept unless
    ``delete_old_private``.  Returns the new ring.
    """
    d = _keys_dir(Path(data_dir))
    now = now or utc_now_iso()
    retire_at = now
    if grace_seconds:
        retire_at = (parse_utc(now) + timedelta(seconds=grace_seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with _locked(d):
        index = _read_index(d)
        sk, name = _new_key_file(d)
        for e in index:
            if e.get("status") == "active":
                e["status"] = "retired"
                e["not_after"] = retire_at
                if delete_old_private:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(d / e["file"])
                    e["file"] = None
        index.append({"key_id": sk.key_id, "file": name, "public_key": sk.public_key_b64,
                      "not_before": now, "not_after": None, "status": "active"})
        _write_index(d, index)
        log.info("rotated signing key: new active key %s", sk.key_id)
        return _ring_from_index(d, index)
