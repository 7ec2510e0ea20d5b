"""The shadow copies' minutes: per minute and route, candidate pool, primary pool, kind and
sampled or not, the judge's sufficient statistics and what the report and console show of the
copies (gateway/promotion/shadow_minutes.py), which the judge, the weekly report and the
console's shadow summary read instead of every shadow record. The records stored before are
summarized here into hours, a day at a time, so a week written by an older version is judged
the same.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
DAY_S = 86400.0
COUNTS = (
    ("sent", "Copies sent."),
    ("answered", "Copies with no upstream error."),
    ("failed", "Copies whose answer failed."),
    ("primary_failed", "Primary answers that failed."),
    ("only_failed", "Copies that failed, their primary not."),
    ("only_primary_failed", None),
    ("slo_primary_met", None),
    ("slo_met", "Copies that met their SLO class's targets."),
    ("slo_only_primary", "Primary met its SLO, the copy not."),
    ("slo_only_met", None),
    ("priced", "Answered copies with both costs known."),
    ("cheaper", "Of those, the copy's cost was lower."),
)
JSON = (
    ("failures", "JSON: how copies failed → n."),
    ("errors", "JSON: upstream error → n."),
    ("measures", "JSON: measure → [n, sum] over answered copies."),
    ("latency", "JSON: side_latency → sketch over answered copies."),
    ("pairs", "JSON: judged pairs by class → [n, with words known, words]."),
    ("worst", "JSON: the least similar answered copies, [similarity, normalized, exact, id]."),
    ("floor", "JSON: the noise floor's differing pairs' similarities → n."),
)
# The columns as this revision makes them, whatever the table holds later.
COLUMNS = (
    "ts", "span_s", "route", "candidate_pool", "primary_pool", "kind", "sampled",
    *(name for name, _ in COUNTS),
    "energy_pairs", "primary_energy_j", "candidate_energy_j",
    "cost_pairs", "primary_cost_usd", "candidate_cost_usd", "floor_pairs",
    "first_ts", "last_ts", *(name for name, _ in JSON),
)  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "shadow_minutes",
        sa.Column("id", ID, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False, comment="Start of the span, Unix seconds."),
        sa.Column(
            "span_s",
            sa.Float(),
            nullable=False,
            comment="60 for a minute, 3600 for an hour compacted.",
        ),
        sa.Column("route", sa.String(length=64), nullable=False),
        sa.Column("candidate_pool", sa.String(length=64), nullable=False),
        sa.Column("primary_pool", sa.String(length=64), nullable=False),
        sa.Column(
            "kind", sa.String(length=16), nullable=False, comment="candidate, or noise (A/A)."
        ),
        sa.Column("sampled", sa.Boolean(), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False, comment=note) for name, note in COUNTS),
        sa.Column(
            "energy_pairs",
            sa.Integer(),
            nullable=False,
            comment="Answered copies with both energies.",
        ),
        sa.Column("primary_energy_j", sa.Float(), nullable=False),
        sa.Column("candidate_energy_j", sa.Float(), nullable=False),
        sa.Column(
            "cost_pairs", sa.Integer(), nullable=False, comment="Answered copies with both costs."
        ),
        sa.Column("primary_cost_usd", sa.Float(), nullable=False),
        sa.Column("candidate_cost_usd", sa.Float(), nullable=False),
        sa.Column(
            "floor_pairs",
            sa.Integer(),
            nullable=False,
            comment="Noise-floor pairs judged that did not fail.",
        ),
        sa.Column(
            "first_ts", sa.Float(), nullable=False, comment="The first copy's primary arrival."
        ),
        sa.Column("last_ts", sa.Float(), nullable=False),
        *(sa.Column(name, sa.Text(), nullable=True, comment=note) for name, note in JSON),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("shadow_minutes") as batch_op:
        batch_op.create_index("ix_shadow_minutes_ts", ["ts"], unique=False)
    summarize_stored(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table("shadow_minutes") as batch_op:
        batch_op.drop_index("ix_shadow_minutes_ts")
    op.drop_table("shadow_minutes")


def summarize_stored(conn: sa.Connection) -> None:
    """Fold the shadow records stored so far into minutes, a day at a time (a minute never
    spans two days, so each day's rows are whole), each copy with its primary's SLO class and
    measured energy and cost from its request record, as the judge read them."""
    import importlib

    from gateway.promotion.shadow_minutes import HOUR_S, RECORD_COLUMNS, summarize

    # The policy whose SLO classes judge the stored copies: as migration 0016 finds it.
    targets = importlib.import_module("gateway.db.migrations.versions.0016_request_minutes")
    # A measure a later migration adds is not there yet: its copies read it as unmeasured.
    held = {c["name"] for c in sa.inspect(conn).get_columns("shadow_records")}
    shadows = sa.table(
        "shadow_records",
        sa.column("decision_id"),
        *(sa.column(n) for n in RECORD_COLUMNS if n in held),
    )
    requests = sa.table(
        "request_records",
        sa.column("decision_id"),
        sa.column("slo_class"),
        sa.column("energy_j"),
        sa.column("cost_usd"),
    )
    c, r = shadows.c, requests.c
    joined = {
        "primary_energy_j": sa.func.coalesce(c.primary_energy_j, r.energy_j),
        "primary_cost_usd": sa.func.coalesce(c.primary_cost_usd, r.cost_usd),
        "slo_class": r.slo_class,
    }
    columns = [
        joined[n].label(n) if n in joined else c[n] if n in held else sa.null().label(n)
        for n in RECORD_COLUMNS
    ]
    first, last = conn.execute(sa.select(sa.func.min(c.ts), sa.func.max(c.ts))).one()
    if first is None:
        return
    targets_of = targets._targets(conn)
    minutes = sa.table("shadow_minutes", *(sa.column(n) for n in COLUMNS))
    day = first - first % DAY_S
    written = 0
    while day <= last:
        rows = conn.execute(
            sa.select(*columns)
            .select_from(shadows.outerjoin(requests, r.decision_id == c.decision_id))
            .where(c.ts >= day, c.ts < day + DAY_S)
        ).mappings()
        summary = [{n: getattr(m, n) for n in COLUMNS} for m in summarize(rows, targets_of, HOUR_S)]
        if summary:
            conn.execute(minutes.insert(), summary)
        written += len(summary)
        day += DAY_S
    log.info("summarized the stored shadow records into %d minute rows", written)
