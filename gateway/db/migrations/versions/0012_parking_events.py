"""Parking events: each backend drained, parked, woken and back in service, and each hook failure.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "parking_events",
        sa.Column("id", ID, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Unix seconds."),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column(
            "event",
            sa.String(length=16),
            nullable=False,
            comment="drain, parked, wake, ready, or failed (a hook call).",
        ),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "seconds",
            sa.Float(),
            comment="parked: the drain's length; wake: the time parked; ready: the wake-up's.",
        ),
        sa.Column(
            "saved_j",
            sa.Float(),
            comment="wake: energy not drawn while parked, against the pool's idle draw.",
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("parking_events") as batch_op:
        batch_op.create_index("ix_parking_events_ts", ["ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("parking_events") as batch_op:
        batch_op.drop_index("ix_parking_events_ts")
    op.drop_table("parking_events")
