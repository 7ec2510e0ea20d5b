"""Tolerance measures on every compared pair: where the tokens first differ, whether that was a
near tie, a KL estimate from top-k logprobs, and the answers' semantic similarity.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("token_divergence", sa.Integer, "First token that differs (logprobs)."),
    ("near_tie", sa.Boolean, "The candidate's token there is a primary top-k."),
    ("kl_divergence", sa.Float, "Mean KL from top-k logprobs, in nats."),
    ("semantic_similarity", sa.Float, "Cosine of the answers' embeddings."),
)


def upgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        for name, kind, comment in _COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=True, comment=comment))


def downgrade() -> None:
    with op.batch_alter_table("shadow_records") as batch_op:
        for name, _, _ in reversed(_COLUMNS):
            batch_op.drop_column(name)
