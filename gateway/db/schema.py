"""The database schema: every table the gateway keeps, in one place, as the migrations build it.

Rows are written by their owners (request and shadow records, policy versions, cost models,
promotion verdicts, rollouts, precision checks) and read by the judge, the reports and the admin
API; retention deletes the old ones. `gateway/db/migrations/` creates exactly these tables: a
test compares the two.

The two records written per request and per shadow copy are defined once, as dataclasses, and
their tables derived from them (`table`): a column per field, typed and nullable as the field
is, with what `column` says of it in the field's metadata. A shadow record's measures are the
fields of compare's `Diff`, stored flat.
"""

from __future__ import annotations

import operator
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import sqlalchemy as sa

from gateway.compare.measures import Diff
from gateway.db.partitions import is_partition

metadata = sa.MetaData()

# Integer keys: 64-bit where rows are many, SQLite's own INTEGER (its rowid) there.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

TEXT = 0  # the width of a string column of any length
_TYPES: dict[Any, Callable[[], sa.types.TypeEngine[Any]]] = {
    bool: sa.Boolean,
    int: sa.Integer,
    float: sa.Float,
    dict: sa.Text,  # JSON, written by the record's row()
}


def column(
    *,
    width: int | None = None,
    comment: str | None = None,
    index: bool = False,
    unique: bool = False,
) -> dict[str, Any]:
    """What a record's field says of its column, as the field's metadata: a string's width, and
    the table's comment, index and uniqueness. Nullable follows the field's type (`X | None`),
    the SQL type its Python type.
    """
    return {"width": width, "comment": comment, "index": index, "unique": unique}


def table(name: str, record: type, *extra: sa.schema.SchemaItem) -> sa.Table:
    """The table that holds a record's rows: an id, then a column per field, in their order."""
    return sa.Table(
        name, metadata, sa.Column("id", _ID, primary_key=True), *_columns(record), *extra
    )


def _columns(record: type) -> Iterator[sa.Column[Any]]:
    hints = typing.get_type_hints(record)
    for f in fields(record):
        hint = hints[f.name]
        if is_dataclass(hint):  # a record within the record, stored as its own columns
            yield from _columns(typing.cast(type, hint))
            continue
        parts = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        (kind,) = (p for p in parts if p is not type(None))
        kind = typing.get_origin(kind) or kind
        width = f.metadata.get("width")
        if kind is str:
            assert width is not None, f"{record.__name__}.{f.name}: a string column needs a width"
            sql: sa.types.TypeEngine[Any] = sa.Text() if width == TEXT else sa.String(width)
        else:
            sql = _TYPES[kind]()
        yield sa.Column(
            f.name,
            sql,
            nullable=type(None) in parts or kind is dict,
            index=f.metadata.get("index") or None,
            unique=f.metadata.get("unique") or None,
            comment=f.metadata.get("comment"),
        )


_READERS: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {}


def row_of(record: Any) -> dict[str, Any]:
    """Return a dataclass record as a table row (shallow; asdict's deep copy costs more)."""
    reader = _READERS.get(type(record))
    if reader is None:
        names = tuple(f.name for f in fields(record))
        reader = _READERS[type(record)] = (names, operator.attrgetter(names[0], *names[1:]))
    names, values = reader
    return dict(zip(names, values(record), strict=True))


policy_versions = sa.Table(
    "policy_versions",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("content", sa.Text, nullable=False, comment="The policy YAML, as applied."),
    sa.Column("hash", sa.String(64), nullable=False, comment="SHA-256 of content."),
    sa.Column("author", sa.String(128), nullable=False),
    sa.Column("created", sa.Float, nullable=False, comment="Unix seconds."),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("restores", sa.Integer, comment="For a rollback: the version whose content it is."),
)


active_policy = sa.Table(
    "active_policy",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False, comment="Always 1."),
    sa.Column("version", sa.Integer, sa.ForeignKey("policy_versions.version"), nullable=False),
    sa.Column("updated", sa.Float, nullable=False, comment="Unix seconds."),
    sa.CheckConstraint("id = 1", name="ck_active_policy_one_row"),
)


@dataclass(slots=True)
class RequestRecord:
    """What the gateway keeps about one request; never the prompt or the answer."""

    decision_id: str = field(metadata=column(width=32))
    ts: float = field(metadata=column(index=True, comment="Arrival, Unix seconds."))
    endpoint: str = field(metadata=column(width=16))
    route: str | None = field(metadata=column(width=64))
    pool: str | None = field(metadata=column(width=64))
    backend: str | None = field(metadata=column(width=64))
    model: str = field(metadata=column(width=128))
    tenant: str | None = field(metadata=column(width=64))
    slo_class: str | None = field(metadata=column(width=32))
    stream: bool
    prompt_tokens: int | None
    prompt_tokens_estimated: int | None
    max_tokens: int | None
    completion_tokens: int | None
    queue_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    gateway_ms: float | None
    attempts: int
    fallback: bool
    status: int
    error: str | None = field(metadata=column(width=64))
    energy_j: float | None = field(
        default=None, metadata=column(comment="Measured energy attributed to the request.")
    )
    cost_usd: float | None = field(
        default=None, metadata=column(comment="Energy price plus the device time it held.")
    )
    energy_estimated: bool | None = field(
        default=None,
        metadata=column(
            comment="True when the pool reported no power and energy_j is from nominal figures."
        ),
    )
    concurrent: int | None = field(
        default=None, metadata=column(comment="Requests on the backend, this one included.")
    )
    context_tokens: int | None = field(
        default=None,
        metadata=column(
            comment="KV-cache tokens its backend held at admission (every replica's), its own in."
        ),
    )
    cached_tokens: int | None = field(
        default=None,
        metadata=column(comment="Prompt tokens the backend found in its prefix cache, as it said."),
    )
    predicted_ttft_ms: float | None = None
    predicted_e2e_ms: float | None = None
    predicted_energy_j: float | None = None
    first_pool: str | None = field(
        default=None,
        metadata=column(width=64, comment="The pool tried first, before any fallback."),
    )

    def row(self) -> dict[str, Any]:
        return row_of(self)


request_records = table(
    "request_records",
    RequestRecord,
    # The rollout guards' read of a canary's requests (migration 0007 says which query).
    sa.Index("ix_request_records_route_first_pool_ts", "route", "first_pool", "ts"),
    # A decision's request, found by its id and time (an energy update, a copy's request). On
    # PostgreSQL the key holds the partition key, ts (migration 0019); SQLite's decision ids
    # are unique on their own (0001), which the planner uses the same way.
    sa.Index(
        "ix_request_records_decision_id_ts",
        "decision_id",
        "ts",
        unique=True,
        info={"only": "postgresql"},
    ),
)


@dataclass(slots=True)
class ShadowRecord:
    """One mirrored copy: who answered, how fast, and how the two answers differ."""

    decision_id: str = field(metadata=column(width=32, index=True))
    ts: float = field(metadata=column(index=True, comment="Primary's arrival, Unix seconds."))
    route: str = field(metadata=column(width=64))
    model: str = field(metadata=column(width=128))
    tenant: str | None = field(metadata=column(width=64))
    kind: str = field(metadata=column(width=16))
    endpoint: str = field(metadata=column(width=16))
    stream: bool
    temperature: float | None
    top_p: float | None
    seeded: bool
    sampled: bool
    primary_pool: str = field(metadata=column(width=64))
    primary_backend: str | None = field(metadata=column(width=64))
    candidate_pool: str = field(metadata=column(width=64))
    candidate_backend: str | None = field(metadata=column(width=64))
    primary_status: int
    candidate_status: int | None
    candidate_error: str | None = field(metadata=column(width=64))
    primary_ttft_ms: float | None = None
    primary_tpot_ms: float | None = None
    primary_e2e_ms: float | None = None
    candidate_ttft_ms: float | None = None
    candidate_tpot_ms: float | None = None
    candidate_e2e_ms: float | None = None
    primary_prompt_tokens: int | None = None
    primary_completion_tokens: int | None = None
    candidate_prompt_tokens: int | None = None
    candidate_completion_tokens: int | None = None
    # Stored as its own columns, one per measure (gateway/compare/measures.py).
    diff: Diff = field(default_factory=Diff)
    primary_energy_j: float | None = None
    candidate_energy_j: float | None = None
    primary_cost_usd: float | None = None
    candidate_cost_usd: float | None = None
    primary_text: str | None = field(default=None, metadata=column(width=TEXT))
    candidate_text: str | None = field(default=None, metadata=column(width=TEXT))
    text_expires_at: float | None = field(
        default=None,
        metadata=column(index=True, comment="When the stored texts are erased, Unix seconds."),
    )
    # gateway/compare/failures.py: each answer judged against the other's (migration 0015).
    failure: str | None = field(
        default=None, metadata=column(width=16, comment="How the copy's answer failed.")
    )
    primary_failure: str | None = field(
        default=None, metadata=column(width=16, comment="How the primary's answer failed.")
    )

    def row(self) -> dict[str, Any]:
        row = row_of(self)
        row.update(row.pop("diff").stored())
        return row


shadow_records = table(
    "shadow_records",
    ShadowRecord,
    # The judge, the summary and the rollout guards read one route's time range (migration 0007).
    sa.Index("ix_shadow_records_route_ts", "route", "ts"),
)


def request_of_copy(
    since: float | None = None, until: float | None = None
) -> sa.ColumnElement[bool]:
    """Join a shadow copy to its primary's request record: the same decision id and time (a
    copy's ts is its primary's arrival). The copies' period bounds the requests' too, which on
    PostgreSQL names the day partitions to read. The judge's evidence
    (gateway/promotion/evidence.py) and the shadow summary (gateway/shadow/summary.py) read the
    primary's SLO class, energy and cost through it."""
    r, c = request_records.c, shadow_records.c
    on = [r.decision_id == c.decision_id, r.ts == c.ts]
    if since is not None:
        on.append(r.ts >= since)
    if until is not None:
        on.append(r.ts < until)
    return sa.and_(*on)


shadow_drops = sa.Table(
    "shadow_drops",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column(
        "ts", sa.Float, nullable=False, index=True, comment="Start of the minute, Unix seconds."
    ),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("candidate_pool", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(32), nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Index("ix_shadow_drops_route_ts", "route", "ts"),
)


cost_models = sa.Table(
    "cost_models",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("created", sa.Float, nullable=False, comment="Unix seconds."),
    sa.Column("observations", sa.Integer, nullable=False),
    sa.Column("status", sa.String(16), nullable=False, comment="ok, or failed"),
    sa.Column("error", sa.Text, comment="Why training failed."),
    sa.Column("scores", sa.Text, comment="JSON: pool → model → target → {observations, mape}."),
    sa.Column("residuals", sa.Text, comment="JSON: the learned weights and bounds."),
)


promotion_evaluations = sa.Table(
    "promotion_evaluations",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column("ts", sa.Float, nullable=False, index=True, comment="Unix seconds."),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("candidate", sa.String(64), nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False, comment="promote, hold or reject"),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("evidence", sa.Text, nullable=False, comment="JSON: every check with its numbers."),
)


rollouts = sa.Table(
    "rollouts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("candidate", sa.String(64), nullable=False),
    sa.Column("former_primary", sa.String(64), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, comment="rolling, complete, rolled_back"),
    sa.Column("step", sa.Integer, nullable=False, comment="Index into rollout_steps; -1: none."),
    sa.Column("weight", sa.Float, nullable=False),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("step_started", sa.Float, nullable=False),
    sa.Column("history", sa.Text, nullable=False, comment="JSON list of {ts, event, weight}."),
)


precision_checks = sa.Table(
    "precision_checks",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("ts", sa.Float, nullable=False, comment="Unix seconds."),
    sa.Column("pool", sa.String(64), nullable=False, comment="The candidate pool checked."),
    sa.Column("reference", sa.String(64), nullable=False),
    sa.Column("suite", sa.Text, nullable=False, comment="The suite file, as named."),
    sa.Column("verdict", sa.String(16), nullable=False, comment="pass or fail"),
    sa.Column("result", sa.Text, nullable=False, comment="JSON: the check's figures and reasons."),
    sa.Index("ix_precision_checks_pool_ts", "pool", "ts"),
)


@dataclass(slots=True)
class ParkingEvent:
    """A step of parking a backend or waking it (gateway/parking/driver.py), and why."""

    ts: float = field(metadata=column(index=True, comment="Unix seconds."))
    pool: str = field(metadata=column(width=64))
    backend: str = field(metadata=column(width=64))
    event: str = field(
        metadata=column(width=16, comment="drain, parked, wake, ready, or failed (a hook call).")
    )
    reason: str = field(metadata=column(width=TEXT))
    seconds: float | None = field(
        default=None,
        metadata=column(
            comment="parked: the drain's length; wake: the time parked; ready: the wake-up's."
        ),
    )
    saved_j: float | None = field(
        default=None,
        metadata=column(
            comment="wake: energy not drawn while parked, against the pool's idle draw."
        ),
    )

    def row(self) -> dict[str, Any]:
        return row_of(self)


parking_events = table("parking_events", ParkingEvent)


@dataclass(slots=True)
class BackendEnergy:
    """One backend's draw over (part of) a minute: the energy its meter read, idle included,
    and the time it was on and parked (gateway/energy/draw.py). The fleet's energy and
    device-hours over any period are sums of these rows."""

    ts: float = field(metadata=column(index=True, comment="Start of the minute, Unix seconds."))
    pool: str = field(metadata=column(width=64))
    backend: str = field(metadata=column(width=64))
    on_s: float = field(metadata=column(comment="Seconds in service, draining or waking."))
    parked_s: float = field(metadata=column(comment="Seconds parked."))
    energy_j: float = field(
        metadata=column(comment="Energy the backend drew, idle included: its meter's reading.")
    )
    estimated_j: float = field(
        metadata=column(
            comment="Of energy_j, the part estimated from nominal figures (no meter reading)."
        )
    )

    def row(self) -> dict[str, Any]:
        return row_of(self)


backend_energy = table("backend_energy", BackendEnergy)


@dataclass(slots=True)
class RequestMinute:
    """The requests of one minute and key: their count, errors and SLO met, sums of tokens,
    energy and cost, the cost model's errors and latency sketches (gateway/records/minutes.py).
    The traffic's figures over any period are sums of these rows."""

    ts: float = field(metadata=column(index=True, comment="Start of the minute, Unix seconds."))
    route: str | None = field(metadata=column(width=64))
    pool: str | None = field(metadata=column(width=64))
    model: str = field(metadata=column(width=128))
    endpoint: str = field(metadata=column(width=16))
    slo_class: str | None = field(metadata=column(width=32))
    stream: bool
    requests: int
    errors: int = field(metadata=column(comment="Requests whose status was not 200."))
    slo_met: int
    prompt_tokens: int
    completion_tokens: int
    energy_n: int = field(metadata=column(comment="Requests whose energy is known."))
    energy_j: float
    energy_j_tokened: float = field(
        metadata=column(comment="Energy of the requests with known energy and tokens.")
    )
    energy_tokens: int = field(metadata=column(comment="Tokens of those requests."))
    cost_n: int = field(metadata=column(comment="Requests whose cost is known."))
    cost_usd: float
    cost_usd_tokened: float = field(
        metadata=column(comment="Cost of the requests with known cost and tokens.")
    )
    cost_tokens: int = field(metadata=column(comment="Tokens of those requests."))
    e2e_ape: float = field(
        metadata=column(comment="Sum of |e2e - predicted| / e2e over successful requests.")
    )
    e2e_ape_n: int
    energy_ape: float = field(
        metadata=column(comment="Sum of |energy - predicted| / energy over successful requests.")
    )
    energy_ape_n: int
    ttft_ms: str | None = field(metadata=column(width=TEXT, comment="JSON sketch: bucket → n."))
    tpot_ms: str | None = field(metadata=column(width=TEXT, comment="JSON sketch: bucket → n."))
    e2e_ms: str | None = field(
        metadata=column(width=TEXT, comment="JSON sketch of successful requests: bucket → n.")
    )

    def row(self) -> dict[str, Any]:
        return row_of(self)


request_minutes = table("request_minutes", RequestMinute)


@dataclass(slots=True)
class ShadowMinute:
    """The shadow copies of one minute (or, once compacted, one hour or one day) and key: the
    judge's sufficient statistics (copies, failures, SLO and costs paired with the primary's,
    the compared pairs by class) and what the report and console show (measures' sums, latency
    sketches), as gateway/promotion/shadow_minutes.py folds them. Any period's evidence is a sum
    of these rows."""

    ts: float = field(metadata=column(index=True, comment="Start of the span, Unix seconds."))
    span_s: float = field(
        metadata=column(comment="60 for a minute, 3600 for an hour, 86400 for a day compacted.")
    )
    route: str = field(metadata=column(width=64))
    candidate_pool: str = field(metadata=column(width=64))
    primary_pool: str = field(metadata=column(width=64))
    kind: str = field(metadata=column(width=16, comment="candidate, or noise (A/A)."))
    sampled: bool
    sent: int = field(metadata=column(comment="Copies sent."))
    answered: int = field(metadata=column(comment="Copies with no upstream error."))
    failed: int = field(metadata=column(comment="Copies whose answer failed."))
    primary_failed: int = field(metadata=column(comment="Primary answers that failed."))
    only_failed: int = field(metadata=column(comment="Copies that failed, their primary not."))
    only_primary_failed: int
    slo_primary_met: int
    slo_met: int = field(metadata=column(comment="Copies that met their SLO class's targets."))
    slo_only_primary: int = field(metadata=column(comment="Primary met its SLO, the copy not."))
    slo_only_met: int
    priced: int = field(metadata=column(comment="Answered copies with both costs known."))
    cheaper: int = field(metadata=column(comment="Of those, the copy's cost was lower."))
    energy_pairs: int = field(metadata=column(comment="Answered copies with both energies."))
    primary_energy_j: float
    candidate_energy_j: float
    cost_pairs: int = field(metadata=column(comment="Answered copies with both costs."))
    primary_cost_usd: float
    candidate_cost_usd: float
    floor_pairs: int = field(metadata=column(comment="Noise-floor pairs judged that did not fail."))
    first_ts: float = field(metadata=column(comment="The first copy's primary arrival."))
    last_ts: float
    failures: str | None = field(
        metadata=column(width=TEXT, comment="JSON: how copies failed → n.")
    )
    errors: str | None = field(metadata=column(width=TEXT, comment="JSON: upstream error → n."))
    measures: str | None = field(
        metadata=column(width=TEXT, comment="JSON: measure → [n, sum] over answered copies.")
    )
    latency: str | None = field(
        metadata=column(width=TEXT, comment="JSON: side_latency → sketch over answered copies.")
    )
    pairs: str | None = field(
        metadata=column(
            width=TEXT, comment="JSON: judged pairs by class → [n, with words known, words]."
        )
    )
    worst: str | None = field(
        metadata=column(
            width=TEXT,
            comment="JSON: the least similar answered copies, [similarity, normalized, exact, id].",
        )
    )
    floor: str | None = field(
        metadata=column(
            width=TEXT, comment="JSON: the noise floor's differing pairs' similarities → n."
        )
    )

    def row(self) -> dict[str, Any]:
        return row_of(self)


shadow_minutes = table("shadow_minutes", ShadowMinute)


def compared(dialect: str) -> dict[str, Any]:
    """Return the options that compare these tables with a database of `dialect` (alembic's
    `include_name` and `include_object`): a day partition is its table's (gateway/db/partitions.py),
    and an index made only on another database is not looked for."""

    def include_name(name: str | None, kind: str, _: Any) -> bool:
        return not (kind == "table" and name is not None and is_partition(name))

    def include_object(item: Any, _name: Any, kind: str, _reflected: bool, _to: Any) -> bool:
        return kind != "index" or item.info.get("only", dialect) == dialect

    return {"include_name": include_name, "include_object": include_object}
