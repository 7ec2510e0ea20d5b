"""How each answer of a shadow pair failed, if it did (gateway/compare/failures.py): errors,
timeouts, broken streams, null, empty and cut-short answers count against the side that gave
them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        batch_op.add_column(
            sa.Column(
                "failure",
                sa.String(16),
                nullable=True,
                comment="How the copy's answer failed.",
            )
        )
        batch_op.add_column(
            sa.Column(
                "primary_failure",
                sa.String(16),
                nullable=True,
                comment="How the primary's answer failed.",
            )
        )
    # Copies stored before: their upstream errors are the failures known of them.
    shadow = sa.table(
        "shadow_records", sa.column("candidate_error", sa.String), sa.column("failure", sa.String)
    )
    for error, kind in (
        ("upstream_timeout", "timeout"),
        ("stream_broken", "broken"),
        ("upstream_error", "error"),
        ("upstream_client_error", "error"),
    ):
        op.execute(shadow.update().where(shadow.c.candidate_error == error).values(failure=kind))


def downgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        batch_op.drop_column("primary_failure")
        batch_op.drop_column("failure")
