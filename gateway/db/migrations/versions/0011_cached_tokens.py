"""Cached tokens: the prompt tokens a request's backend found in its prefix cache.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "request_records",
        sa.Column(
            "cached_tokens",
            sa.Integer(),
            comment="Prompt tokens the backend found in its prefix cache, as it said.",
        ),
    )


def downgrade() -> None:
    op.drop_column("request_records", "cached_tokens")
