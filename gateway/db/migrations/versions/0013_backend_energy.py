"""Backend energy: per backend and minute, the energy its meter read (idle included) and the time
it was on and parked, from which the fleet's energy and device-hours are summed.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "backend_energy",
        sa.Column("id", ID, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Start of the minute, Unix seconds."),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column(
            "on_s", sa.Float(), nullable=False, comment="Seconds in service, draining or waking."
        ),
        sa.Column("parked_s", sa.Float(), nullable=False, comment="Seconds parked."),
        sa.Column(
            "energy_j",
            sa.Float(),
            nullable=False,
            comment="Energy the backend drew, idle included: its meter's reading.",
        ),
        sa.Column(
            "estimated_j",
            sa.Float(),
            nullable=False,
            comment="Of energy_j, the part estimated from nominal figures (no meter reading).",
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("backend_energy") as batch_op:
        batch_op.create_index("ix_backend_energy_ts", ["ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("backend_energy") as batch_op:
        batch_op.drop_index("ix_backend_energy_ts")
    op.drop_table("backend_energy")
