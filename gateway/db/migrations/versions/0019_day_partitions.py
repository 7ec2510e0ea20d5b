"""Day partitions on PostgreSQL: request and shadow records become tables partitioned by `ts`,
a UTC day per partition plus a default one (gateway/db/partitions.py), so retention drops a day
whole instead of deleting its rows one by one. SQLite is left as it is.

Each table is rebuilt: the old one is renamed, its rows move into the new one's partitions (one
for every day from its oldest row to AHEAD_DAYS ahead), then its indexes are built again, each
on every partition. A partitioned table's unique keys must hold its partition key, so a request
record's decision id is unique together with its `ts` (which a decision id never has two of);
its primary key is (id, ts). On SQLite, decision ids stay unique on their own (0001).

Revision ID: 0019
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0016"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

# Each table's indexes as this revision leaves them: (name, columns, unique).
INDEXES = {
    "request_records": [
        ("ix_request_records_ts", "ts", False),
        ("ix_request_records_route_first_pool_ts", "route, first_pool, ts", False),
    ],
    "shadow_records": [
        ("ix_shadow_records_decision_id", "decision_id", False),
        ("ix_shadow_records_ts", "ts", False),
        ("ix_shadow_records_route_ts", "route, ts", False),
        ("ix_shadow_records_text_expires_at", "text_expires_at", False),
    ],
}
# The unique key of a request's decision: with ts when partitioned, alone before.
PARTITIONED_UNIQUE = ("ix_request_records_decision_id_ts", "decision_id, ts")
PLAIN_UNIQUE = ("request_records_decision_id_key", "decision_id")


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    from gateway.db import partitions

    for table in partitions.PARTITIONED:
        old = _set_aside(conn, table)
        conn.execute(
            sa.text(
                f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING COMMENTS)"
                " PARTITION BY RANGE (ts)"
            )
        )
        conn.execute(
            sa.text(f"CREATE TABLE {partitions.default_name(table)} PARTITION OF {table} DEFAULT")
        )
        first = conn.execute(sa.text(f"SELECT min(ts) FROM {old}")).scalar()
        today = partitions.day_of(time.time())
        partitions.make_days(
            conn,
            table,
            min(first or today, today),
            today + partitions.AHEAD_DAYS * partitions.DAY_S,
        )
        moved = conn.execute(sa.text(f"INSERT INTO {table} SELECT * FROM {old}")).rowcount
        _take_over(conn, table, old)
        conn.execute(sa.text(f"ALTER TABLE {table} ADD PRIMARY KEY (id, ts)"))
        _index(conn, table, _indexes(table))
        log.info("%s: %d rows moved into day partitions", table, moved)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    from gateway.db import partitions

    for table in partitions.PARTITIONED:
        old = _set_aside(conn, table)
        conn.execute(
            sa.text(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING COMMENTS)")
        )
        conn.execute(sa.text(f"INSERT INTO {table} SELECT * FROM {old}"))
        _take_over(conn, table, old)
        conn.execute(sa.text(f"ALTER TABLE {table} ADD PRIMARY KEY (id)"))
        if table == "request_records":
            name, columns = PLAIN_UNIQUE
            conn.execute(sa.text(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE ({columns})"))
        _index(conn, table, INDEXES[table])


def _set_aside(conn: sa.Connection, table: str) -> str:
    """Rename `table` out of the way, without the keys and indexes whose names its successor
    takes; return its new name."""
    old = f"{table}_before_0019"
    conn.execute(sa.text(f"ALTER TABLE {table} RENAME TO {old}"))
    conn.execute(sa.text(f"ALTER TABLE {old} DROP CONSTRAINT {table}_pkey"))
    for name, _, _ in _indexes(table):
        conn.execute(sa.text(f"DROP INDEX IF EXISTS {name}"))
    if table == "request_records":
        conn.execute(sa.text(f"ALTER TABLE {old} DROP CONSTRAINT IF EXISTS {PLAIN_UNIQUE[0]}"))
    return old


def _indexes(table: str) -> list[tuple[str, str, bool]]:
    """Return `table`'s indexes when partitioned."""
    if table == "request_records":
        return [*INDEXES[table], (*PARTITIONED_UNIQUE, True)]
    return INDEXES[table]


def _take_over(conn: sa.Connection, table: str, old: str) -> None:
    """Give `old`'s id sequence to `table`, which numbers from it already, and drop `old`."""
    sequence = conn.execute(sa.text(f"SELECT pg_get_serial_sequence('{old}', 'id')")).scalar()
    conn.execute(sa.text(f"ALTER SEQUENCE {sequence} OWNED BY {table}.id"))
    conn.execute(sa.text(f"DROP TABLE {old}"))


def _index(conn: sa.Connection, table: str, indexes: list[tuple[str, str, bool]]) -> None:
    for name, columns, unique in indexes:
        kind = "UNIQUE INDEX" if unique else "INDEX"
        conn.execute(sa.text(f"CREATE {kind} {name} ON {table} ({columns})"))
