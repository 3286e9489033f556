"""Start-ups that explain themselves (issue 40): a setting the service cannot start with ends the process with one
line that names the setting and the fix, never a traceback and never a respawn loop.

Everything the service loads at start-up that a user configures goes through here: the settings themselves
(``OLU_*``), the data directory, the database URL, the encryption key and the signing key.  Each failure becomes a
``ConfigurationError`` whose message is that line; ``refuse`` prints it and exits 1 (3 inside a uvicorn worker,
uvicorn's STARTUP_FAILURE, on which its supervisor stops instead of starting the worker again).  What the service
can safely create itself (the data directory, its encryption key, its signing key ring) it creates and logs."""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

log = logging.getLogger("olu")

KEYGEN_SIGNING = "olu keygen PATH (an Ed25519 PEM, mode 0600)"
KEYGEN_ENCRYPTION = "olu keygen --encryption (base64 of 32 random bytes)"


class ConfigurationError(RuntimeError):
    """The settings cannot be served safely; the message says which variable, why, and how to fix it."""


def refuse(error: ConfigurationError | str, what: str = "refusing to start") -> NoReturn:
    """Print ``olu: <what>: <error>`` as one line on stderr and exit: 1, or 3 in a process that uvicorn's
    supervisor started (``--workers N``), so that it stops rather than respawning a worker that fails the same way."""
    line = " ".join(str(error).split())
    print(f"olu: {what}: {line}", file=sys.stderr, flush=True)
    raise SystemExit(3 if multiprocessing.parent_process() is not None else 1)


def env_name(field: str) -> str:
    return f"OLU_{field.upper()}"


def load_settings(**values):
    """``Settings()``, a refused value named as its ``OLU_`` variable with pydantic's reason."""
    from pydantic import ValidationError

    from .config import Settings

    try:
        return Settings(**values)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            field = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__") or "settings"
            parts.append(f"{env_name(field)}: {err.get('msg', 'invalid value')}")
        raise ConfigurationError("; ".join(parts) + " (docs/configuration.md lists every setting and its range)") \
            from None


def redact_url(url: str) -> str:
    """The URL without its password (a database URL is printed in refusals)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparseable URL: show its scheme only
        return url.split("://", 1)[0] + "://…" if "://" in url else "(unparseable)"


def _why(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError):
        return "no such file"
    if isinstance(e, IsADirectoryError):
        return "is a directory, not a file"
    if isinstance(e, PermissionError):
        import os

        return f"permission denied for this process (uid {os.getuid()})" if hasattr(os, "getuid") else \
            "permission denied"
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    return " ".join(str(e).split()) or type(e).__name__


@contextlib.contextmanager
def explained(subject: str, fix: str) -> Iterator[None]:
    """OS and value errors inside become ``ConfigurationError("<subject>: <why>; <fix>")``."""
    try:
        yield
    except ConfigurationError:
        raise
    except (OSError, ValueError) as e:
        raise ConfigurationError(f"{subject}: {_why(e)}; {fix}") from None


def prepare_data_dir(settings) -> None:
    from .db.files import secure_data_dir

    with explained(f"OLU_DATA_DIR={settings.data_dir}",
                   "point OLU_DATA_DIR at a directory this process may create and write (it holds the SQLite "
                   "database and the keys, mode 0700)"):
        secure_data_dir(settings.data_dir)


def open_database(settings):
    """The ``Database`` of ``OLU_DATABASE_URL``: a malformed URL, a driver that is not installed, or (when it
    migrates at start-up) a server that cannot be reached or refuses the login, is refused with the URL's password
    hidden.  The engine itself connects lazily; with OLU_AUTO_MIGRATE=false a replica starts and /readyz waits."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from .db.session import Database

    url = settings.resolved_database_url
    shown = redact_url(url)
    fix = ("a SQLAlchemy URL such as postgresql+psycopg://user@host:5432/db or sqlite:////abs/path/olu.db "
           "(unset OLU_DATABASE_URL for SQLite in OLU_DATA_DIR)")
    try:
        return Database(url, sqlite_synchronous=settings.sqlite_synchronous)
    except NoSuchModuleError as e:
        raise ConfigurationError(f"OLU_DATABASE_URL={shown}: no database driver for it ({e}); use {fix}") from None
    except (ArgumentError, ValueError) as e:
        raise ConfigurationError(f"OLU_DATABASE_URL={shown}: not a database URL ({_why(e)}); use {fix}") from None
    except ImportError as e:
        raise ConfigurationError(f"OLU_DATABASE_URL={shown}: its driver is not installed ({e.name or e}); "
                                 "install it (PostgreSQL: psycopg, in the default install)") from None
    except OSError as e:
        raise ConfigurationError(f"OLU_DATABASE_URL={shown}: {_why(e)}; the SQLite file's directory must exist "
                                 "and be writable by this process") from None


def database_unreachable(settings, e: BaseException) -> ConfigurationError:
    """The one line for a database that does not answer (or refuses the login) at start-up."""
    orig = getattr(e, "orig", None) or e
    reason = " ".join(str(orig).split())
    reason = reason if len(reason) <= 300 else reason[:300] + "…"
    return ConfigurationError(
        f"OLU_DATABASE_URL={redact_url(settings.resolved_database_url)}: the database cannot be reached at start-up "
        f"({reason}); start it, check the host, port, user and database name, or set OLU_AUTO_MIGRATE=false to "
        "start anyway and let /readyz wait for it")


def load_cipher(settings):
    """The at-rest cipher: ``OLU_ENCRYPTION_KEY`` (or the key generated into the data directory on first start,
    logged) and ``OLU_ENCRYPTION_KEYS_OLD``."""
    from . import crypto

    active = settings.encryption_key.get_secret_value() if settings.encryption_key else None
    old = settings.encryption_keys_old.get_secret_value() if settings.encryption_keys_old else None
    if active and active.strip():
        with explained("OLU_ENCRYPTION_KEY", f"give base64 of 32 bytes, e.g. from {KEYGEN_ENCRYPTION}"):
            crypto.parse_key(active)
    for i, k in enumerate(k for k in (old or "").split(",") if k.strip()):
        with explained(f"OLU_ENCRYPTION_KEYS_OLD (key {i + 1})",
                       "give the older keys as comma-separated base64 of 32 bytes each"):
            crypto.parse_key(k)
    key_file = Path(settings.data_dir) / crypto.KEY_FILE
    created = not (active and active.strip()) and not key_file.exists()
    with explained(f"the encryption key file {key_file} (OLU_DATA_DIR)",
                   f"restore it from your backup, or set OLU_ENCRYPTION_KEY ({KEYGEN_ENCRYPTION}); a new key cannot "
                   "open what the old one sealed"):
        cipher = crypto.load_cipher(settings.data_dir, active, old)
    if created and key_file.exists():
        log.info("generated the at-rest encryption key %s (mode 0600): back it up with the database, which it "
                 "opens; or set OLU_ENCRYPTION_KEY", key_file)
    return cipher


def load_keyring(settings):
    """The receipt-signing key ring: ``OLU_SIGNING_KEY``, else ``OLU_SIGNING_KEY_FILE``, else the ring in the data
    directory (created with a fresh key on first start, logged by the key store)."""
    from .receipts.keys import KeyLoadError
    from .receipts.keystore import load_or_create_keyring

    env_key = settings.signing_key.get_secret_value() if settings.signing_key else None
    key_file = settings.signing_key_file
    if env_key is not None and env_key.strip():
        subject, fix = "OLU_SIGNING_KEY", f"give an Ed25519 key as PEM or base64 of its 32-byte seed ({KEYGEN_SIGNING})"
    elif key_file is not None:
        subject = f"OLU_SIGNING_KEY_FILE={key_file}"
        fix = (f"make the key with `olu keygen {key_file}` (an Ed25519 PEM, mode 0600), point the variable at an "
               "existing key, or unset it to keep the key ring in OLU_DATA_DIR (created on first start)")
    else:
        subject = f"the signing key ring in {Path(settings.data_dir) / 'signing-keys'} (OLU_DATA_DIR)"
        fix = "restore the directory from your backup, or set OLU_SIGNING_KEY_FILE to the key"
    if env_key is None or not env_key.strip():
        with contextlib.suppress(OSError):
            if key_file is not None and Path(key_file).is_file() and Path(key_file).stat().st_size == 0:
                raise ConfigurationError(f"{subject}: the file is empty; {fix}")
    ring_dir = Path(settings.data_dir) / "signing-keys"
    first = env_key is None and key_file is None and not (ring_dir / "index.json").exists()
    try:
        with explained(subject, fix):
            ring = load_or_create_keyring(settings.data_dir, env_key, key_file)
    except KeyLoadError as e:
        raise ConfigurationError(f"{subject}: {e}; {fix}") from None
    if first:
        log.info("generated the receipt-signing key %s in %s (mode 0600): back it up; replicas share it through "
                 "a shared OLU_DATA_DIR, or set OLU_SIGNING_KEY_FILE (olu keygen PATH)", ring.key_id, ring_dir)
    return ring
