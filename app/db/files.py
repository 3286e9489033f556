"""Owner-only files: the data directory is 0700, the database files and keys in it are 0600.

SQLite creates a database file with mode 0644 (less the umask), and its ``-wal``, ``-shm`` and ``-journal`` files
with the database file's mode.  So the database file is created here, 0600, before SQLite opens it; the side
files then follow.  At start-up the files of an existing install that the service's user owns are tightened to
the same modes (a file owned by another user is left as it is: chmod would fail).
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def _tighten(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` when it exists, is not a symbolic link and is ours; never raises."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) == mode:
            return
        os.chmod(path, mode)


def secure_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with mode 0700, or tighten it to 0700 when it exists and is ours."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    _tighten(path, DIR_MODE)
    return path


def secure_data_dir(data_dir: Path) -> Path:
    """The data directory 0700, and what the service keeps in it (database files, encryption key, signing keys)
    0600 / 0700: creates the directory, tightens an existing install."""
    from ..crypto import KEY_FILE
    from ..receipts.keys import KEYS_DIRNAME

    d = secure_dir(data_dir)
    for name in ("olu.db", *("olu.db" + s for s in SQLITE_SIDE_FILES), KEY_FILE):
        _tighten(d / name, FILE_MODE)
    keys = d / KEYS_DIRNAME
    if keys.is_dir() and not keys.is_symlink():
        _tighten(keys, DIR_MODE)
        with contextlib.suppress(OSError):
            for entry in os.scandir(keys):
                if entry.is_file(follow_symlinks=False):
                    _tighten(Path(entry.path), FILE_MODE)
    return d


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL (None: not SQLite, in memory, or a ``file:`` URI)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if not u.drivername.startswith("sqlite"):
        return None
    db = u.database or ""
    if not db or db == ":memory:" or db.startswith("file:") or u.query.get("uri"):
        return None
    return Path(db)


def prepare_sqlite_file(path: Path) -> None:
    """Create the database file with mode 0600 before SQLite opens it (its WAL, shared-memory and journal files
    take the database file's mode), and tighten an existing one and its side files to 0600."""
    path = Path(path)
    with contextlib.suppress(OSError):  # exists already; or cannot be made: SQLite then says why when it opens it
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    _tighten(path, FILE_MODE)
    for suffix in SQLITE_SIDE_FILES:
        _tighten(path.with_name(path.name + suffix), FILE_MODE)
