"""Policy versions: every applied policy, and the one-row pointer to the active version.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policy_versions",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("content", sa.Text(), nullable=False, comment="The policy YAML, as applied."),
        sa.Column("hash", sa.String(length=64), nullable=False, comment="SHA-256 of content."),
        sa.Column("author", sa.String(length=128), nullable=False),
        sa.Column("created", sa.Float(), nullable=False, comment="Unix seconds."),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column(
            "restores",
            sa.Integer(),
            nullable=True,
            comment="For a rollback: the version whose content it is.",
        ),
        sa.PrimaryKeyConstraint("version"),
    )
    op.create_table(
        "active_policy",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False, comment="Always 1."),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False, comment="Unix seconds."),
        sa.CheckConstraint("id = 1", name="ck_active_policy_one_row"),
        sa.ForeignKeyConstraint(["version"], ["policy_versions.version"]),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("active_policy")
    op.drop_table("policy_versions")
