"""Shadow records: one row per mirrored copy and its diff; shadow drops counted per minute.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shadow_records",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("decision_id", sa.String(length=32), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Primary's arrival, Unix seconds."),
        sa.Column("route", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("endpoint", sa.String(length=16), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("top_p", sa.Float(), nullable=True),
        sa.Column("seeded", sa.Boolean(), nullable=False),
        sa.Column("sampled", sa.Boolean(), nullable=False),
        sa.Column("primary_pool", sa.String(length=64), nullable=False),
        sa.Column("primary_backend", sa.String(length=64), nullable=True),
        sa.Column("candidate_pool", sa.String(length=64), nullable=False),
        sa.Column("candidate_backend", sa.String(length=64), nullable=True),
        sa.Column("primary_status", sa.Integer(), nullable=False),
        sa.Column("candidate_status", sa.Integer(), nullable=True),
        sa.Column("candidate_error", sa.String(length=64), nullable=True),
        sa.Column("primary_ttft_ms", sa.Float(), nullable=True),
        sa.Column("primary_tpot_ms", sa.Float(), nullable=True),
        sa.Column("primary_e2e_ms", sa.Float(), nullable=True),
        sa.Column("candidate_ttft_ms", sa.Float(), nullable=True),
        sa.Column("candidate_tpot_ms", sa.Float(), nullable=True),
        sa.Column("candidate_e2e_ms", sa.Float(), nullable=True),
        sa.Column("primary_prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("primary_completion_tokens", sa.Integer(), nullable=True),
        sa.Column("candidate_prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("candidate_completion_tokens", sa.Integer(), nullable=True),
        sa.Column("exact_match", sa.Boolean(), nullable=True),
        sa.Column("normalized_match", sa.Boolean(), nullable=True),
        sa.Column("similarity", sa.Float(), nullable=True),
        sa.Column("similarity_method", sa.String(length=16), nullable=True),
        sa.Column("first_divergence", sa.Integer(), nullable=True),
        sa.Column("length_ratio", sa.Float(), nullable=True),
        sa.Column("json_diff", sa.Text(), nullable=True),
        sa.Column("embedding_cosine", sa.Float(), nullable=True),
        sa.Column("measures", sa.Text(), nullable=True),
        sa.Column("primary_energy_j", sa.Float(), nullable=True),
        sa.Column("candidate_energy_j", sa.Float(), nullable=True),
        sa.Column("primary_cost_usd", sa.Float(), nullable=True),
        sa.Column("candidate_cost_usd", sa.Float(), nullable=True),
        sa.Column("primary_text", sa.Text(), nullable=True),
        sa.Column("candidate_text", sa.Text(), nullable=True),
        sa.Column(
            "text_expires_at",
            sa.Float(),
            nullable=True,
            comment="When the stored texts are erased, Unix seconds.",
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("shadow_records", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_shadow_records_decision_id"), ["decision_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_shadow_records_ts"), ["ts"], unique=False)
        batch_op.create_index(
            "ix_shadow_records_route_candidate", ["route", "candidate_pool"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_shadow_records_text_expires_at"), ["text_expires_at"], unique=False
        )

    op.create_table(
        "shadow_drops",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Start of the minute, Unix seconds."),
        sa.Column("route", sa.String(length=64), nullable=False),
        sa.Column("candidate_pool", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("shadow_drops", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_shadow_drops_ts"), ["ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("shadow_drops", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_shadow_drops_ts"))

    op.drop_table("shadow_drops")
    with op.batch_alter_table("shadow_records", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_shadow_records_text_expires_at"))
        batch_op.drop_index("ix_shadow_records_route_candidate")
        batch_op.drop_index(batch_op.f("ix_shadow_records_ts"))
        batch_op.drop_index(batch_op.f("ix_shadow_records_decision_id"))

    op.drop_table("shadow_records")
