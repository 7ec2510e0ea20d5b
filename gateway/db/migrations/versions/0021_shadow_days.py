"""The shadow minutes of settled days become a row per day and key: the writer's compaction now
folds a day's rows a day after it ends (gateway/promotion/shadow_minutes.py `compact`), so the
judge reads a week as a few rows per route and candidate, whatever the traffic. The days already
settled are folded here, so an upgraded database is read that way at once.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

import importlib
import logging
import time

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    with op.batch_alter_table("shadow_minutes") as batch_op:
        batch_op.alter_column(
            "span_s",
            existing_type=sa.Float(),
            existing_nullable=False,
            comment="60 for a minute, 3600 for an hour, 86400 for a day compacted.",
            existing_comment="60 for a minute, 3600 for an hour compacted.",
        )
    fold_settled_days(op.get_bind())


def downgrade() -> None:
    # Day rows stay: every reader sums rows whatever their span.
    with op.batch_alter_table("shadow_minutes") as batch_op:
        batch_op.alter_column(
            "span_s",
            existing_type=sa.Float(),
            existing_nullable=False,
            comment="60 for a minute, 3600 for an hour compacted.",
            existing_comment="60 for a minute, 3600 for an hour, 86400 for a day compacted.",
        )


def fold_settled_days(conn: sa.Connection) -> None:
    """Fold the rows of the days a day settled into a row per day and key, as the writer's
    compaction does, on the table as revision 0020 made it."""
    from gateway.promotion.shadow_minutes import DAY_S, compacted_before, fold

    made = importlib.import_module("gateway.db.migrations.versions.0020_shadow_minutes")
    table = sa.table("shadow_minutes", sa.column("id"), *(sa.column(name) for name in made.COLUMNS))
    day, _ = compacted_before(time.time())
    log.info("folded %d shadow minute rows into days", fold(conn, day, DAY_S, table))
