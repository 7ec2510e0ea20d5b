"""Rollouts: each candidate's rollout on a route, and the pool each request tried first.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("route", sa.String(length=64), nullable=False),
        sa.Column("candidate", sa.String(length=64), nullable=False),
        sa.Column("former_primary", sa.String(length=64), nullable=False),
        sa.Column(
            "state",
            sa.String(length=16),
            nullable=False,
            comment="rolling, complete, rolled_back",
        ),
        sa.Column(
            "step", sa.Integer(), nullable=False, comment="Index into rollout_steps; -1: none."
        ),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("started", sa.Float(), nullable=False),
        sa.Column("step_started", sa.Float(), nullable=False),
        sa.Column(
            "history", sa.Text(), nullable=False, comment="JSON list of {ts, event, weight}."
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("request_records") as batch_op:
        batch_op.add_column(
            sa.Column(
                "first_pool",
                sa.String(length=64),
                nullable=True,
                comment="The pool tried first, before any fallback.",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("request_records") as batch_op:
        batch_op.drop_column("first_pool")
    op.drop_table("rollouts")
