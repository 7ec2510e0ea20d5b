"""Precision checks: each replay of a prompt suite on a candidate pool against a reference.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "precision_checks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Unix seconds."),
        sa.Column(
            "pool", sa.String(length=64), nullable=False, comment="The candidate pool checked."
        ),
        sa.Column("reference", sa.String(length=64), nullable=False),
        sa.Column("suite", sa.Text(), nullable=False, comment="The suite file, as named."),
        sa.Column("verdict", sa.String(length=16), nullable=False, comment="pass or fail"),
        sa.Column(
            "result", sa.Text(), nullable=False, comment="JSON: the check's figures and reasons."
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("precision_checks") as batch_op:
        batch_op.create_index("ix_precision_checks_pool_ts", ["pool", "ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("precision_checks") as batch_op:
        batch_op.drop_index("ix_precision_checks_pool_ts")
    op.drop_table("precision_checks")
