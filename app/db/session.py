"""Database engine and transactions.

A request that changes a model runs in one transaction holding that model's lock: ``BEGIN IMMEDIATE`` on
SQLite (one writer at a time, readers continue under WAL), ``SELECT ... FOR UPDATE`` on the model row on
PostgreSQL (ARCHITECTURE.md §4).  Reads use plain transactions.
"""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from . import usage_shards
from .files import prepare_sqlite_file, sqlite_file

WRITE_OPTION = "olu_write"
SQLITE_MMAP_BYTES = 1 << 30
log = logging.getLogger("olu.db")


def make_engine(url: str, *, sqlite_synchronous: str = "FULL") -> Engine:
    if url.startswith("sqlite"):
        path = sqlite_file(url)
        if path is not None:
            prepare_sqlite_file(path)  # 0600 before SQLite creates it 0644 (its -wal and -shm take its mode)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record):  # pragma: no cover - exercised by every SQLite test
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (pysqlite's own BEGIN is deferred)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={sqlite_synchronous}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA secure_delete=ON")  # forgotten rows leave no copy in free pages
            # reads map the file instead of copying each page through SQLite's cache: a replay reading retained
            # chunks of megabytes reads ~4x faster (issue 36); writes are unchanged (WAL, write(2))
            cur.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "BEGIN")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class Database:
    def __init__(self, url: str, *, sqlite_synchronous: str = "FULL"):
        self.url = url
        self.engine = make_engine(url, sqlite_synchronous=sqlite_synchronous)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # the tenant usage deltas a write noted are applied last, just before its commit (usage_shards.py)
        event.listen(self._sessions, "before_commit", usage_shards.apply_pending)
        event.listen(self._sessions, "after_rollback", usage_shards.discard_pending)
        self._own = threading.local()  # SQLite: each thread's own connection for short reads (own_read)
        self._own_connections: list[Connection] = []

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            with session.begin():
                yield session

    @contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """A read transaction on a bare connection: for prebuilt Core queries on hot read paths."""
        with self.engine.connect() as conn:
            with conn.begin():
                yield conn

    @contextmanager
    def own_read(self) -> Iterator[Connection]:
        """SQLite only: a read transaction on this thread's own connection, kept open between calls (the
        transaction is not).  For short reads made on the event loop: a pooled connection could make the loop wait
        for a worker thread to return one, and under WAL a reader never waits for a writer."""
        conn = getattr(self._own, "conn", None)
        if conn is None or conn.closed or conn.invalidated:
            conn = self._own.conn = self.engine.connect()
            self._own_connections.append(conn)
        with conn.begin():
            yield conn

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction; on SQLite it takes the write lock up front (BEGIN IMMEDIATE)."""
        with self._sessions() as session:
            session.connection(execution_options={WRITE_OPTION: True})
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def scrub_wal(self, attempts: int = 3) -> bool:
        """SQLite: ``PRAGMA wal_checkpoint(TRUNCATE)``: every WAL frame is copied into the database file and the WAL
        is cut to zero bytes, so no file keeps a page as it was before a forget (secure_delete has already zeroed
        the deleted rows in the pages the checkpoint writes).  Waits for readers through the busy handler; True
        once done.  PostgreSQL: nothing to do here (its WAL is the server's; docs/operations.md)."""
        if not self.is_sqlite:
            return True
        try:
            raw = self.engine.raw_connection()
            try:
                for _ in range(attempts):
                    busy, _log, _done = raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    if not busy:
                        return True
            finally:
                raw.close()
        except Exception:  # noqa: BLE001 - the forget has committed: its answer must not turn into a 500
            log.exception("WAL checkpoint (TRUNCATE) failed")
            return False
        log.warning("WAL checkpoint (TRUNCATE) stayed busy; it is retried after the next forget and at start-up")
        return False

    def dispose(self) -> None:
        for conn in self._own_connections:
            conn.close()
        self._own_connections.clear()
        self.engine.dispose()
