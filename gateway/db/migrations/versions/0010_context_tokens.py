"""Context tokens: the KV cache a request's backend held when it was admitted, its own included.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "request_records",
        sa.Column(
            "context_tokens",
            sa.Integer(),
            comment="KV-cache tokens its backend held at admission (every replica's), its own in.",
        ),
    )


def downgrade() -> None:
    op.drop_column("request_records", "context_tokens")
