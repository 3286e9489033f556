"""Issue 21 item 4: the data directory and everything the service keeps in it are owner-only (directories 0700,
files 0600): the SQLite database and its -wal / -shm files, the encryption key, the signing keys.  An existing
install with looser modes is tightened at start-up."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from .conftest import start_server
from .helpers import create_model, examples, unit_rows


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def _assert_owner_only(root: Path) -> dict[str, int]:
    modes = _modes(root)
    loose = {name: oct(m) for name, m in modes.items() if m & 0o077}
    assert not loose, f"readable or writable by others: {loose}"
    for name, m in modes.items():
        p = root / name
        assert m == (0o700 if p.is_dir() else 0o600), (name, oct(m))
    return modes


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # the usual default: SQLite's own files would come out 0644
    yield
    os.umask(old)


@pytest.mark.parametrize("backend_name", ["sqlite", "postgresql"])
def test_data_dir_is_owner_only_after_create_learn_forget(tmp_path, umask_022, backend_name, request):
    data_dir = tmp_path / "data"  # created by the service
    url = (f"sqlite:///{data_dir / 'olu.db'}" if backend_name == "sqlite"
           else request.getfixturevalue("postgres_url"))  # the data dir then holds the keys only
    srv, (uv, thread) = start_server(url, data_dir, backend_name)
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            mid = create_model(c, dim=3)["id"]
            assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 3))}).status_code == 200
            assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0", "rec-1"]}).status_code == 200
            modes = _assert_owner_only(data_dir)  # while the server holds the database open (-wal, -shm exist)
            expected = {"encryption.key", "signing-keys"} | ({"olu.db", "olu.db-wal", "olu.db-shm"}
                                                             if backend_name == "sqlite" else set())
            assert expected <= set(modes), modes
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()
    _assert_owner_only(data_dir)


def test_an_existing_install_is_tightened_at_start_up(tmp_path, umask_022):
    from app.config import Settings
    from app.main import create_app

    data_dir = tmp_path / "data"
    app = create_app(Settings(data_dir=data_dir))
    app.state.ctx.db.dispose()
    # loosen everything, as an install made before this change (or by a careless copy) would be
    for p in [data_dir, *data_dir.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    (data_dir / "olu.db-wal").touch(mode=0o644)
    app = create_app(Settings(data_dir=data_dir))
    try:
        _assert_owner_only(data_dir)
    finally:
        app.state.ctx.db.dispose()


def test_sqlite_file_outside_the_data_dir_is_created_0600(tmp_path, umask_022):
    from app.db.files import prepare_sqlite_file, sqlite_file

    path = tmp_path / "elsewhere" / "my.db"
    path.parent.mkdir()
    assert sqlite_file(f"sqlite:///{path}") == path
    assert sqlite_file("sqlite://") is None and sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql+psycopg://u@h/db") is None
    prepare_sqlite_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    for suffix in ("-wal", "-shm"):  # SQLite gives them the database file's mode
        assert stat.S_IMODE(Path(str(path) + suffix).stat().st_mode) == 0o600, suffix
    conn.close()


def test_symlinks_are_left_alone(tmp_path):
    from app.db.files import secure_data_dir

    d = secure_data_dir(tmp_path / "d")
    target = tmp_path / "outside.txt"
    target.write_text("x")
    os.chmod(target, 0o644)
    (d / "encryption.key").symlink_to(target)
    secure_data_dir(d)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # a link is not followed out of the data dir
