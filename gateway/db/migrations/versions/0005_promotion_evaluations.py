"""Promotion evaluations: every verdict of the judge with its evidence.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "promotion_evaluations",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Unix seconds."),
        sa.Column("route", sa.String(length=64), nullable=False),
        sa.Column("candidate", sa.String(length=64), nullable=False),
        sa.Column(
            "outcome", sa.String(length=16), nullable=False, comment="promote, hold or reject"
        ),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "evidence", sa.Text(), nullable=False, comment="JSON: every check with its numbers."
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("promotion_evaluations") as batch_op:
        batch_op.create_index("ix_promotion_evaluations_ts", ["ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("promotion_evaluations") as batch_op:
        batch_op.drop_index("ix_promotion_evaluations_ts")
    op.drop_table("promotion_evaluations")
