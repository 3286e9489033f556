"""Alembic environment: uses the connection handed over by app.db.migrate, or OLU settings' URL."""
from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from app.db.tables import Base

config = context.config
target_metadata = Base.metadata


def run_with(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_with(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from app.config import Settings

        url = Settings().resolved_database_url
    engine = create_engine(url)
    with engine.begin() as conn:
        run_with(conn)
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_online()
