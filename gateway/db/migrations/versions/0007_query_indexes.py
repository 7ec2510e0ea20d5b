"""Indexes for the queries that filter by route and time: rollout guards, judge, shadow summary.

Every other query the gateway runs is already served: the weekly report, what-if and cost-model
training read a time range (the `ts` indexes of 0001 and 0002), the report and the judge join a
shadow record to its request by `decision_id` (unique since 0001), and policy versions, cost
models and the active pointer are read by primary key.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("request_records") as batch_op:
        # Rollout guards (gateway.promotion.rollout.guards) read the canary's requests every check:
        # route = ? AND first_pool = ? AND ts >= step start. The canary gets a small share of
        # the route, so without first_pool in the key most of the range would be read for nothing.
        batch_op.create_index(
            "ix_request_records_route_first_pool_ts", ["route", "first_pool", "ts"], unique=False
        )
    with op.batch_alter_table("shadow_records") as batch_op:
        # The judge for one route (gateway.promotion.evidence.load_evidence: route = ? AND ts >= ?),
        # the shadow summary for a route (gateway.shadow.records.summarize) and the rollout guards'
        # reverse shadow sample (route = ? AND ts >= step start, the rest filtered on the few rows
        # left).
        batch_op.create_index("ix_shadow_records_route_ts", ["route", "ts"], unique=False)
        # (route, candidate_pool) served no query better than (route, ts) now does: none filters
        # on the candidate alone, and the summary's "candidate = ? OR kind = noise" cannot use it
        # past the route. Dropping it saves a write on every shadow record.
        batch_op.drop_index("ix_shadow_records_route_candidate")
    with op.batch_alter_table("shadow_drops") as batch_op:
        # The shadow summary for a route reads its drop counts with the same filters as its
        # records (route = ? AND ts >= ?).
        batch_op.create_index("ix_shadow_drops_route_ts", ["route", "ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("shadow_drops") as batch_op:
        batch_op.drop_index("ix_shadow_drops_route_ts")
    with op.batch_alter_table("shadow_records") as batch_op:
        batch_op.create_index(
            "ix_shadow_records_route_candidate", ["route", "candidate_pool"], unique=False
        )
        batch_op.drop_index("ix_shadow_records_route_ts")
    with op.batch_alter_table("request_records") as batch_op:
        batch_op.drop_index("ix_request_records_route_first_pool_ts")
