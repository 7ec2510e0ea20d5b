"""The database: migrations round-trip to the tables in code, and the queries use the indexes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from rows import request_record, shadow_record, store_shadow_minutes

from gateway.compare.measures import MEASURES
from gateway.db import partitions
from gateway.db.connection import alembic_config, connect, upgrade
from gateway.db.schema import (
    TEXT,
    column,
    compared,
    metadata,
    request_minutes,
    request_records,
    shadow_drops,
    shadow_records,
    table,
)
from gateway.ops import views
from gateway.policy import versions
from gateway.policy.load import content_hash, load_policy, parse_policy
from gateway.promotion import evidence, rollout
from gateway.promotion.shadow_summary import summarize
from gateway.records.minutes import summarize as minutes
from gateway.records.minutes import targets_of
from gateway.report import records as report_records
from gateway.report.period import Period
from gateway.whatif.simulate import recorded_requests
from gateway.whatif.windows import sample_windows
from policies import fleet_policy


def schema_drift(url: str) -> list[Any]:
    db = connect(url)
    with db.connect() as conn:
        context = MigrationContext.configure(conn, opts=compared(conn.dialect.name))
        diff = compare_metadata(context, metadata)
    db.dispose()
    return diff


def test_migrations_go_down_to_nothing_and_up_again_to_the_tables_in_code(database: str) -> None:
    config = alembic_config(database)
    command.downgrade(config, "base")
    db = connect(database)
    assert sa.inspect(db).get_table_names() == ["alembic_version"]
    db.dispose()
    upgrade(database)
    assert schema_drift(database) == []


def test_drift_between_migrations_and_code_is_reported(database: str) -> None:
    """The comparison above would notice a migration that forgot an index of the code."""
    command.downgrade(alembic_config(database), "0006")
    drift = schema_drift(database)
    assert "ix_shadow_records_route_ts" in {
        d[1].name for d in drift if isinstance(d, tuple) and d[0] == "add_index"
    }


# Query plans -------------------------------------------------------------------------------

DAY = 86400.0
NOW = 1_790_000_000.0
ROUTES = [f"route-{n}" for n in range(8)]
POOLS = ["gpu", "asic", "cim"]
# The queries ask for a route with 1/64 of the traffic: where reading by time alone wastes most.
SMALL = "route-5"


def route_of(n: int) -> str:
    """Return the route of the n-th record: route-k takes 2^-(k+1) of the traffic."""
    k = 0
    while n % 2 and k < len(ROUTES) - 1:
        n //= 2
        k += 1
    return ROUTES[k]


def fill(db: sa.Engine) -> None:
    """Store 60 days of records over eight routes of unequal traffic; refresh the statistics."""
    requests, shadows, drops = [], [], []
    for n in range(16_000):
        ts = NOW - 60 * DAY * n / 16_000
        r = request_record(n)
        requests.append(
            dataclasses.replace(
                r, ts=ts, route=route_of(n), pool=POOLS[n % 3], first_pool=POOLS[n % 3]
            ).row()
        )
    for n in range(8_000):
        s = shadow_record(n, decision_id=f"{n:032x}", ts=NOW - 60 * DAY * n / 8_000)
        shadows.append(
            dataclasses.replace(s, route=route_of(n), candidate_pool=POOLS[1 + n % 2]).row()
        )
    for n in range(4_000):
        drops.append(
            {
                "ts": NOW - 60 * DAY * n / 4_000,
                "route": route_of(n),
                "candidate_pool": POOLS[1 + n % 2],
                "kind": "candidate",
                "reason": "queue_full",
                "count": 1,
            }
        )
    with db.begin() as conn:
        conn.execute(request_records.insert(), requests)
        conn.execute(shadow_records.insert(), shadows)
        conn.execute(shadow_drops.insert(), drops)
        conn.execute(request_minutes.insert(), [m.row() for m in minutes(requests, no_targets)])
    store_shadow_minutes(db)
    with db.begin() as conn:
        analyze(conn)


def analyze(conn: sa.Connection) -> None:
    """Refresh the planner's statistics of this database's tables. On PostgreSQL only the
    schema's own tables: a bare ANALYZE visits every schema of the server's database, and
    deadlocks with a test migrating or dropping its own beside it."""
    if conn.dialect.name != "postgresql":
        conn.exec_driver_sql("ANALYZE")
        return
    tables = conn.exec_driver_sql(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
        " AND NOT c.relispartition"
    ).scalars()
    conn.exec_driver_sql("ANALYZE " + ", ".join(f'"{t}"' for t in tables))


@contextlib.contextmanager
def statements(db: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """Collect every SELECT sent to the database while the block runs, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    sa.event.listen(db, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        sa.event.remove(db, "before_cursor_execute", capture)


def _pg_indexes(plan: dict[str, Any]) -> set[str]:
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", ()):
        found |= _pg_indexes(child)
    return found


def _pg_tables_indexes(conn: sa.Connection, names: set[str]) -> set[str]:
    """Name each partition's index (request_records_default_ts_idx) by its table's index
    (ix_request_records_ts), of which it is a part."""
    parents = dict(
        conn.exec_driver_sql(
            "SELECT n, p.relname FROM unnest(%(names)s::text[]) n"
            " JOIN pg_inherits i ON i.inhrelid = to_regclass(n)"
            " JOIN pg_class p ON p.oid = i.inhparent",
            {"names": sorted(names)},
        ).all()
    )
    return {parents.get(name, name) for name in names}


def indexes_used(db: sa.Engine, statement: str, parameters: Any) -> set[str]:
    """Return the indexes the planner chooses for a statement, by their tables' names."""
    with db.connect() as conn:
        if db.dialect.name == "postgresql":
            (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).one()
            used = _pg_indexes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
            return _pg_tables_indexes(conn, used)
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
    return {m.group(1) for r in rows if (m := re.search(r"USING (?:COVERING )?INDEX (\w+)", r[3]))}


def plans(db: sa.Engine, run: Callable[[], object]) -> list[set[str]]:
    """Run a reader and return the indexes each of its queries would use."""
    with statements(db) as seen:
        run()
    assert seen, "the reader sent no query"
    return [indexes_used(db, s, p) for s, p in seen]


@pytest.fixture(scope="module")
def filled(module_database: str) -> Iterator[sa.Engine]:
    """60 days of records, read (never written) by the module's plan tests."""
    db = connect(module_database)
    fill(db)
    yield db
    db.dispose()


def test_judge_of_one_route_reads_its_time_range_by_index(filled: sa.Engine) -> None:
    summed, recent = plans(
        filled,
        lambda: evidence.load_evidence(filled, fleet_policy(), NOW - 14 * DAY, SMALL, now=NOW),
    )
    assert "ix_shadow_minutes_ts" in summed
    assert "ix_shadow_records_route_ts" in recent


def test_rollout_guards_read_the_canary_by_index(filled: sa.Engine) -> None:
    policy = fleet_policy()
    requests, minutes, recent = plans(
        filled, lambda: rollout.guards(filled, policy, SMALL, "asic", NOW - 7 * DAY, now=NOW)
    )
    assert "ix_request_records_route_first_pool_ts" in requests
    assert "ix_shadow_minutes_ts" in minutes
    assert "ix_shadow_records_route_ts" in recent


def test_shadow_summary_of_one_route_reads_minutes_copies_and_drops_by_index(
    filled: sa.Engine,
) -> None:
    recent, minutes, drops = plans(
        filled, lambda: summarize(filled, SMALL, None, NOW - 7 * DAY, now=NOW)
    )
    assert "ix_shadow_records_route_ts" in recent
    assert "ix_shadow_minutes_ts" in minutes
    assert "ix_shadow_drops_route_ts" in drops


def no_targets(_: str | None) -> None:
    return None


def test_weekly_report_and_what_if_read_their_period_by_index(filled: sa.Engine) -> None:
    since, until = NOW - 8 * DAY, NOW - DAY
    policy = fleet_policy()
    (requests,) = plans(
        filled, lambda: report_records.read_traffic(filled, policy, since, until, now=NOW)
    )
    (copies,) = plans(filled, lambda: evidence.shadow_rows(filled, since, until))
    (drops,) = plans(filled, lambda: report_records._read_drops(filled, since, until))
    (replayed,) = plans(filled, lambda: recorded_requests(filled, since, limit=100))
    sampled = plans(filled, lambda: sample_windows(filled, since, until, size=100))
    assert "ix_request_minutes_ts" in requests
    assert "ix_shadow_records_ts" in copies
    assert "ix_shadow_drops_ts" in drops
    assert "ix_request_records_ts" in replayed
    # The sample counts the period's minutes from the request minutes (and the records after
    # the last minute written), then reads each window with its warm-up, all by time indexes.
    counted, tail, *windows = sampled
    assert "ix_request_minutes_ts" in counted and "ix_request_records_ts" in tail
    assert len(windows) > 1 and all("ix_request_records_ts" in used for used in windows)


def test_migration_0002_adds_and_removes_the_shadow_tables(database: str) -> None:
    command.downgrade(alembic_config(database), "0001")
    db = connect(database)
    assert not {"shadow_records", "shadow_drops"} & set(sa.inspect(db).get_table_names())
    upgrade(database, "0002")
    assert {"shadow_records", "shadow_drops"} <= set(
        sa.inspect(connect(database)).get_table_names()
    )


def test_upgrade_writes_each_stored_policys_runtime_as_its_engine_version(
    database: str, repo_root: Path
) -> None:
    config = alembic_config(database)
    command.downgrade(config, "0021")
    new = (repo_root / "policies" / "default.yaml").read_text()
    engine = "    engine: vllm                  # its load series are read on the metrics scrape\n"
    gpu = new.index(engine)
    big = new.index(engine, gpu + 1)

    def edited(first: str, second: str) -> str:
        """The policy with a line before the 8B GPUs' engine and the 70B's engine replaced."""
        return new[:gpu] + first + new[gpu:big] + second + new[big + len(engine) :]

    # The 8B GPUs run vLLM; the 70B's vendor server is one the gateway does not read.
    vendor = "    engine: null\n    runtime: 'vendor-sdk 1.18'\n"
    old = edited('    runtime: "vllm 0.6.3"         # as /version says\n', vendor)
    db = connect(database)
    stored = [versions.record(db, text, "ops", "applied") for text in (old, new)]

    upgrade(database)

    upgraded, unchanged = (versions.get(db, v.version) for v in stored)
    assert unchanged == stored[1] and versions.active_version(db) == unchanged.version
    assert upgraded.content == edited(
        '    engine_version: "0.6.3"       # as /version says\n',
        '    engine: null\n    engine_version: "vendor-sdk 1.18"\n',
    )
    assert upgraded.hash == content_hash(upgraded.content)
    pools = list(parse_policy(upgraded.content).pools.values())
    assert [(p.engine, p.engine_version) for p in pools[:2]] == [
        ("vllm", "0.6.3"),
        (None, "vendor-sdk 1.18"),
    ]

    command.downgrade(config, "0021")  # written back: the engine's name and its version
    assert versions.get(db, upgraded.version).content == old.replace(
        "'vendor-sdk 1.18'", '"vendor-sdk 1.18"'
    )
    db.dispose()


def test_migrations_match_the_table_definitions(database: str) -> None:
    upgrade(database)  # idempotent on an up-to-date database
    assert schema_drift(database) == []


@dataclasses.dataclass
class Measured:
    score: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Probe:
    name: str = dataclasses.field(metadata=column(width=8, index=True))
    count: int
    ok: bool | None
    diff: Measured
    note: str | None = dataclasses.field(default=None, metadata=column(width=TEXT, comment="c"))


def test_a_records_table_has_a_column_per_field_typed_as_the_field_is() -> None:
    probe = table("probe_records", Probe)
    try:
        described = {
            c.name: (type(c.type).__name__, c.nullable, bool(c.index), c.comment)
            for c in probe.columns
        }
        assert described == {
            "id": ("BigInteger", False, False, None),
            "name": ("String", False, True, None),
            "count": ("Integer", False, False, None),
            "ok": ("Boolean", True, False, None),
            "score": ("Float", True, False, None),  # a record within the record: flat
            "extra": ("Text", True, False, None),  # JSON; none is NULL
            "note": ("Text", True, False, "c"),
        }
        assert probe.c.name.type.length == 8
    finally:
        metadata.remove(probe)


def test_every_measure_of_a_pair_is_a_column_of_the_shadow_records() -> None:
    measured = [c.name for c in shadow_records.columns if c.name in MEASURES]
    assert measured == list(MEASURES)
    row = shadow_record(0, json_diff={"missing": ["/a"]}, measures={"bleu": 0.5}).row()
    assert set(row) == {c.name for c in shadow_records.columns} - {"id"}
    assert json.loads(row["json_diff"]) == {"missing": ["/a"]} and json.loads(row["measures"]) == {
        "bleu": 0.5
    }
    assert shadow_record(0).row()["measures"] is None


def test_projected_savings_read_a_routes_sample_by_index(
    filled: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    period = Period(NOW - 8 * DAY, NOW - DAY, "a week")
    (whole,) = plans(filled, lambda: report_records.read_sample(filled, SMALL, period, 30))
    # A route past the sample's size: its minutes, then whole minutes of its records.
    monkeypatch.setattr(report_records, "SAMPLE_REQUESTS", 10)
    served, *sampled = plans(filled, lambda: report_records.read_sample(filled, SMALL, period, 30))
    records_by_time = {"ix_request_records_ts", "ix_request_records_route_first_pool_ts"}
    assert whole & records_by_time
    assert "ix_request_minutes_ts" in served
    assert sampled and all(minute & records_by_time for minute in sampled)


def test_console_traffic_reads_its_window_of_minutes_by_index(filled: sa.Engine) -> None:
    (minutes,) = plans(
        filled,
        lambda: report_records.read_minutes(
            filled, fleet_policy(), NOW - DAY, NOW, views.TRAFFIC_COLUMNS, now=NOW + DAY
        ),
    )
    assert "ix_request_minutes_ts" in minutes


@pytest.mark.parametrize("policy", ["file", "stored with runtime"])
def test_upgrade_summarizes_the_request_records_stored_before_it(
    database: str, repo_root: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    config = alembic_config(database)
    (adds,) = (
        r
        for r in ScriptDirectory.from_config(config).walk_revisions()
        if r.path.endswith("_request_minutes.py")
    )
    command.downgrade(config, adds.down_revision)
    records = []
    for n in range(300):  # two days and a half of an older version's records
        r = dataclasses.replace(
            request_record(n),
            ts=NOW - 2.5 * DAY * n / 300,
            route=route_of(n),
            pool=POOLS[n % 3],
            slo_class=("interactive", "batch", None)[n % 3],
            stream=n % 2 == 0,
            ttft_ms=None if n % 2 else 100.0 + 7 * n,
            e2e_ms=200.0 + 11 * n,
            status=200 if n % 9 else 503,
            energy_j=None if n % 5 == 0 else 0.25 * n,
        )
        records.append(r.row())
    db = connect(database)
    with db.begin() as conn:
        conn.execute(request_records.insert(), records)
    policy_file = repo_root / "policies" / "default.yaml"
    if policy == "file":
        monkeypatch.setenv("GATEWAY_POLICY", str(policy_file))
    else:  # the active version an older gateway stored, its SLO classes read all the same
        old = policy_file.read_text().replace("    engine: vllm", '    runtime: "vllm 0.6.3"', 1)
        versions.record(db, old, "ops", "applied")

    upgrade(database)

    with db.connect() as conn:
        stored = [dict(r._mapping) for r in conn.execute(sa.select(request_minutes))]
    db.dispose()
    expected = [m.row() for m in minutes(records, targets_of(load_policy(policy_file)))]
    assert sorted(map(_comparable, stored)) == sorted(map(_comparable, expected))
    assert sum(m["slo_met"] for m in stored) < sum(r["status"] == 200 for r in records)


def _comparable(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        round(v, 9) if isinstance(v, float) else ("" if v is None else v)
        for k, v in sorted(row.items())
        if k != "id"
    )


@contextlib.contextmanager
def one_text_kept(db: sa.Engine) -> Iterator[None]:
    """Keep the texts of one copy of SMALL's while the block runs, as `store_text` would."""
    copy = shadow_record(10**9, ts=NOW - 60, route=SMALL, candidate_pool="asic").row()
    texts = {"primary_text": "a", "candidate_text": "b", "text_expires_at": NOW + DAY}
    with db.begin() as conn:
        conn.execute(shadow_records.insert(), [copy | texts])
    try:
        yield
    finally:
        with db.begin() as conn:
            conn.execute(
                shadow_records.delete().where(shadow_records.c.decision_id == copy["decision_id"])
            )


def test_console_pairs_and_request_count_read_by_index(filled: sa.Engine) -> None:
    # With no answer text kept (store_text is off by default), the pairs view reads the oldest
    # expiry by its index and stops; with one kept, the route's newest copies by theirs.
    (probe,) = plans(filled, lambda: views.shadow_pairs(filled, SMALL, "asic", 20))
    assert "ix_shadow_records_text_expires_at" in probe
    with one_text_kept(filled):
        probe, pairs = plans(filled, lambda: views.shadow_pairs(filled, SMALL, "asic", 20))
    summed, recent = plans(
        filled, lambda: report_records.count_requests(filled, NOW - DAY, NOW, now=NOW)
    )
    assert "ix_shadow_records_route_ts" in pairs
    assert "ix_request_minutes_ts" in summed
    assert "ix_request_records_ts" in recent


def _pg_scanned(plan: dict[str, Any]) -> set[str]:
    found = {plan["Relation Name"]} if "Relation Name" in plan else set()
    for child in plan.get("Plans", ()):
        found |= _pg_scanned(child)
    return found


def test_a_periods_read_visits_only_its_days_partitions(database: str) -> None:
    if not database.startswith("postgresql"):
        pytest.skip("SQLite keeps each table whole")
    filled = connect(database)  # its own: its rows move into day partitions
    fill(filled)
    with filled.begin() as conn:  # the days the gateway would have made: rows move into them
        for name in partitions.PARTITIONED:
            partitions.make_days(conn, name, NOW - 61 * DAY, NOW)
        analyze(conn)
    since, until = NOW - 8 * DAY, NOW - DAY
    with statements(filled) as seen:
        evidence.shadow_rows(filled, since, until)
        report_records.read_unsettled(filled, fleet_policy(), since, until)
    days = {
        partitions.day_name(name, partitions.day_of(since) + n * DAY)
        for name in partitions.PARTITIONED
        for n in range(9)
    }
    defaults = {partitions.default_name(name) for name in partitions.PARTITIONED}
    for statement, parameters in seen:
        with filled.connect() as conn:
            (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).one()
        scanned = _pg_scanned((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
        assert scanned and scanned <= days | defaults
    filled.dispose()
