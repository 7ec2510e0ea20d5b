"""Energy and the cost model: measured energy, load and predictions per request; model versions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("request_records") as batch_op:
        batch_op.add_column(
            sa.Column(
                "energy_j",
                sa.Float(),
                nullable=True,
                comment="Measured energy attributed to the request.",
            )
        )
        batch_op.add_column(
            sa.Column(
                "cost_usd",
                sa.Float(),
                nullable=True,
                comment="Energy price plus the device time it held.",
            )
        )
        batch_op.add_column(
            sa.Column(
                "energy_estimated",
                sa.Boolean(),
                nullable=True,
                comment=(
                    "True when the pool reported no power and energy_j is from nominal figures."
                ),
            )
        )
        batch_op.add_column(
            sa.Column(
                "concurrent",
                sa.Integer(),
                nullable=True,
                comment="Requests on the backend, this one included.",
            )
        )
        batch_op.add_column(sa.Column("predicted_ttft_ms", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("predicted_e2e_ms", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("predicted_energy_j", sa.Float(), nullable=True))

    op.create_table(
        "cost_models",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("created", sa.Float(), nullable=False, comment="Unix seconds."),
        sa.Column("observations", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False, comment="ok, or failed"),
        sa.Column("error", sa.Text(), nullable=True, comment="Why training failed."),
        sa.Column(
            "scores",
            sa.Text(),
            nullable=True,
            comment="JSON: pool → model → target → {observations, mape}.",
        ),
        sa.Column(
            "residuals", sa.Text(), nullable=True, comment="JSON: the learned weights and bounds."
        ),
        sa.PrimaryKeyConstraint("version"),
    )


def downgrade() -> None:
    op.drop_table("cost_models")
    with op.batch_alter_table("request_records") as batch_op:
        for column in ("predicted_energy_j", "predicted_e2e_ms", "predicted_ttft_ms", "concurrent"):
            batch_op.drop_column(column)
        batch_op.drop_column("energy_estimated")
        batch_op.drop_column("cost_usd")
        batch_op.drop_column("energy_j")
