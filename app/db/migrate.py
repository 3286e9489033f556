"""Alembic from code: upgrade to head at start-up, and the readiness check 'schema at head'."""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_to_head(engine: Engine, cipher=None) -> None:
    """``cipher`` (app.crypto.Cipher): the encryption key a migration may need (0010 seals retained examples)."""
    cfg = alembic_config()
    if cipher is not None:
        cfg.attributes["cipher"] = cipher
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # replicas starting together: one migrates, the others wait (transaction-scoped advisory lock)
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7405512)")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def migration_status(engine: Engine) -> str:
    heads = set(ScriptDirectory.from_config(alembic_config()).get_heads())
    with engine.connect() as conn:
        current = set(MigrationContext.configure(conn).get_current_heads())
    return "head" if current == heads else "behind"
