"""The database: table metadata shared by every record module, engines, and migrations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from alembic.config import Config

metadata = sa.MetaData()

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(url: str) -> sa.Engine:
    """Create an engine; SQLite gets a busy timeout so writers wait instead of failing."""
    if url.startswith("sqlite"):
        return sa.create_engine(url, connect_args={"timeout": 30})
    return sa.create_engine(url, pool_pre_ping=True)


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
