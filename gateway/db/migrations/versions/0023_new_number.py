"""Whether a shadow copy's answer states a number its primary's does not (`new_number`): a
changed quantity departs, however alike the sentences read (gateway/promotion/departures.py).
Records stored before hold no answers to read it from, and keep None: judged as they were.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        batch_op.add_column(
            sa.Column(
                "new_number",
                sa.Boolean,
                nullable=True,
                comment="The candidate states a number the primary does not.",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        batch_op.drop_column("new_number")
