"""Policy versions in the database, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from gateway.db.engine import make_engine
from gateway.errors import Conflict, PolicyStoreUnavailable, PolicyVersionNotFound
from gateway.policy import versions
from gateway.policy.load import content_hash


def test_each_apply_is_a_version_and_becomes_active(database: str) -> None:
    engine = make_engine(database)
    assert versions.active(engine) is None
    first = versions.record(engine, "a: 1\n", "ana", "first")
    second = versions.record(engine, "a: 2\n", "bo", "second")
    assert (first.version, second.version) == (1, 2)
    active = versions.active(engine)
    assert active is not None and active.content == "a: 2\n"
    assert active.hash == content_hash("a: 2\n") and active.author == "bo"
    assert [v.version for v in versions.history(engine)] == [2, 1]
    engine.dispose()


def test_a_rollback_serves_the_version_before_the_active_one_or_the_one_named(
    database: str,
) -> None:
    engine = make_engine(database)
    for n in (1, 2, 3):
        versions.record(engine, f"a: {n}\n", "ana", f"v{n}")
    assert versions.rollback_target(engine).version == 2
    assert versions.rollback_target(engine, 1).content == "a: 1\n"
    back = versions.record(engine, "a: 2\n", "bo", "roll back", restores=2)
    assert (back.version, back.restores) == (4, 2)
    assert versions.rollback_target(engine).version == 3
    with pytest.raises(PolicyVersionNotFound):
        versions.rollback_target(engine, 99)
    assert sorted(versions.contents(engine)) == ["a: 1\n", "a: 2\n", "a: 3\n"]
    engine.dispose()


def test_rollback_needs_a_previous_version(database: str) -> None:
    engine = make_engine(database)
    with pytest.raises(Conflict):
        versions.rollback_target(engine)
    versions.record(engine, "a: 1\n", "ana", "only")
    with pytest.raises(Conflict, match="first"):
        versions.rollback_target(engine)
    engine.dispose()


def test_seeding_keeps_an_existing_active_version(database: str) -> None:
    engine = make_engine(database)
    seeded = versions.record(engine, "a: 1\n", "gw", "seed", only_if_none=True)
    again = versions.record(engine, "a: 9\n", "gw", "seed", only_if_none=True)
    assert seeded.version == again.version == 1 and again.content == "a: 1\n"
    engine.dispose()


def test_a_database_without_the_table_is_a_store_error(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(PolicyStoreUnavailable, match="gateway db upgrade"):
        versions.active_version(engine)
    engine.dispose()
