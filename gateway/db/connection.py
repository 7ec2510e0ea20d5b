"""The database connection: its pool for SQLite and PostgreSQL, and the migrations that build it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def connect(url: str) -> sa.Engine:
    """Create the database's connection pool; SQLite gets a busy timeout and write-ahead logging.

    Statement parameters stay out of errors and logs: they hold answer texts and tenants.
    """
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True, hide_parameters=True)
    db = sa.create_engine(url, connect_args={"timeout": 30}, hide_parameters=True)

    @sa.event.listens_for(db, "connect")
    def _pragmas(connection: Any, _: Any) -> None:
        # WAL lets readers (reports, the admin API) run beside the record writer, and
        # synchronous=NORMAL makes a batch commit cheap while staying safe against crashes.
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return db


def reachable_apart(url: str) -> bool:
    """Say whether another process can open this database (an in-memory SQLite one it cannot)."""
    parsed = sa.make_url(url)
    in_memory = parsed.database in (None, "", ":memory:")
    return parsed.get_backend_name() != "sqlite" or not in_memory


def alembic_config(url: str) -> Config:
    """Return an Alembic configuration for this project's migrations against url."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to revision."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)
