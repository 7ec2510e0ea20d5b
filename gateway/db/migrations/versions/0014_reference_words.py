"""The primary's answer's length in words on every compared pair: what a pair whose answers
match put at risk of departing, so the judge counts departures per word at risk.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        batch_op.add_column(
            sa.Column(
                "reference_words",
                sa.Integer,
                nullable=True,
                comment="Word tokens in the primary's answer.",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        batch_op.drop_column("reference_words")
