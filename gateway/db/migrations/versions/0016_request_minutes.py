"""The traffic's minutes: per minute and route, pool, model, endpoint, SLO class and streaming,
the requests' counts, sums and latency sketches (gateway/records/minutes.py), which everything
that reports on traffic reads instead of every request record. The records stored before are
summarized here, a day at a time, so a week written by an older version reports the same.

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import sqlalchemy as sa
from alembic import op

if TYPE_CHECKING:
    from gateway.records.minutes import TargetsOf

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
DAY_S = 86400.0
# The columns as this revision makes them, whatever the table holds later.
COLUMNS = (
    "ts",
    "route",
    "pool",
    "model",
    "endpoint",
    "slo_class",
    "stream",
    "requests",
    "errors",
    "slo_met",
    "prompt_tokens",
    "completion_tokens",
    "energy_n",
    "energy_j",
    "energy_j_tokened",
    "energy_tokens",
    "cost_n",
    "cost_usd",
    "cost_usd_tokened",
    "cost_tokens",
    "e2e_ape",
    "e2e_ape_n",
    "energy_ape",
    "energy_ape_n",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
)


def upgrade() -> None:
    op.create_table(
        "request_minutes",
        sa.Column("id", ID, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Start of the minute, Unix seconds."),
        sa.Column("route", sa.String(length=64), nullable=True),
        sa.Column("pool", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("endpoint", sa.String(length=16), nullable=False),
        sa.Column("slo_class", sa.String(length=32), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column(
            "errors", sa.Integer(), nullable=False, comment="Requests whose status was not 200."
        ),
        sa.Column("slo_met", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column(
            "energy_n", sa.Integer(), nullable=False, comment="Requests whose energy is known."
        ),
        sa.Column("energy_j", sa.Float(), nullable=False),
        sa.Column(
            "energy_j_tokened",
            sa.Float(),
            nullable=False,
            comment="Energy of the requests with known energy and tokens.",
        ),
        sa.Column(
            "energy_tokens", sa.Integer(), nullable=False, comment="Tokens of those requests."
        ),
        sa.Column("cost_n", sa.Integer(), nullable=False, comment="Requests whose cost is known."),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column(
            "cost_usd_tokened",
            sa.Float(),
            nullable=False,
            comment="Cost of the requests with known cost and tokens.",
        ),
        sa.Column("cost_tokens", sa.Integer(), nullable=False, comment="Tokens of those requests."),
        sa.Column(
            "e2e_ape",
            sa.Float(),
            nullable=False,
            comment="Sum of |e2e - predicted| / e2e over successful requests.",
        ),
        sa.Column("e2e_ape_n", sa.Integer(), nullable=False),
        sa.Column(
            "energy_ape",
            sa.Float(),
            nullable=False,
            comment="Sum of |energy - predicted| / energy over successful requests.",
        ),
        sa.Column("energy_ape_n", sa.Integer(), nullable=False),
        sa.Column("ttft_ms", sa.Text(), nullable=True, comment="JSON sketch: bucket → n."),
        sa.Column("tpot_ms", sa.Text(), nullable=True, comment="JSON sketch: bucket → n."),
        sa.Column(
            "e2e_ms",
            sa.Text(),
            nullable=True,
            comment="JSON sketch of successful requests: bucket → n.",
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("request_minutes") as batch_op:
        batch_op.create_index("ix_request_minutes_ts", ["ts"], unique=False)
    summarize_stored(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table("request_minutes") as batch_op:
        batch_op.drop_index("ix_request_minutes_ts")
    op.drop_table("request_minutes")


def summarize_stored(conn: sa.Connection) -> None:
    """Fold the request records stored so far into minutes, a day at a time (a minute never
    spans two days, so each day's rows are whole)."""
    from gateway.records.minutes import RECORD_COLUMNS, summarize

    records = sa.table("request_records", *(sa.column(n) for n in RECORD_COLUMNS))
    first, last = conn.execute(
        sa.select(sa.func.min(records.c.ts), sa.func.max(records.c.ts))
    ).one()
    if first is None:
        return
    targets = _targets(conn)
    minutes = sa.table("request_minutes", *(sa.column(n) for n in COLUMNS))
    day = first - first % DAY_S
    written = 0
    while day <= last:
        rows = conn.execute(
            sa.select(records).where(records.c.ts >= day, records.c.ts < day + DAY_S)
        ).mappings()
        summary = [{n: getattr(m, n) for n in COLUMNS} for m in summarize(rows, targets)]
        if summary:
            conn.execute(minutes.insert(), summary)
        written += len(summary)
        day += DAY_S
    log.info("summarized the stored request records into %d minute rows", written)


def _targets(conn: sa.Connection) -> TargetsOf:
    """The SLO classes' targets of the active policy stored, else of GATEWAY_POLICY's file; a
    request of a class neither knows meets its SLO when it succeeded."""
    from gateway.policy.load import load_policy, parse_policy
    from gateway.records.minutes import targets_of

    policy = None
    row = conn.execute(
        sa.text(
            "SELECT content FROM policy_versions WHERE version ="
            " (SELECT version FROM active_policy WHERE id = 1)"
        )
    ).first()
    try:
        if row is not None:
            policy = parse_policy(row[0], "the active policy")
        elif os.environ.get("GATEWAY_POLICY"):
            policy = load_policy(os.environ["GATEWAY_POLICY"])
    except Exception as exc:  # a policy this version no longer reads: judge by status alone
        log.warning("cannot read the policy to judge stored requests' SLOs: %s", exc)
    if policy is None:
        return lambda _name: None
    return targets_of(policy)
