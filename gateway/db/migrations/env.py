"""Alembic environment: migrates the database named by the configuration or DATABASE_URL."""

from __future__ import annotations

from alembic import context

from gateway.db.connection import connect
from gateway.db.schema import compared, metadata
from gateway.settings import Settings

url = context.config.get_main_option("sqlalchemy.url") or Settings().database_url


def run_offline() -> None:
    context.configure(url=url, target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    db = connect(url)
    with db.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            **compared(connection.dialect.name),
        )
        with context.begin_transaction():
            context.run_migrations()
    db.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
