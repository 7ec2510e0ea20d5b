"""A migrated database to throw away: a SQLite file, or a PostgreSQL schema of its own."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from gateway.db.connection import upgrade


@contextlib.contextmanager
def scratch_database(postgres_url: str | None, workdir: Path, prefix: str = "t") -> Iterator[str]:
    """Yield the URL of a database migrated to the newest schema; drop its schema after.

    Without `postgres_url` it is a SQLite file in `workdir`; with it, a schema of its own on
    that server (the search path in the URL), so runs side by side never see each other's rows.
    """
    if postgres_url is None:
        sqlite = f"sqlite:///{workdir / 'gateway.db'}"
        upgrade(sqlite)
        yield sqlite
        return
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    scoped = (
        sa.make_url(postgres_url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )
    try:
        upgrade(scoped)
        yield scoped
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()
