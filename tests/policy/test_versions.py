"""Policy versions in the database, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from gateway.db.connection import connect
from gateway.errors import Conflict, PolicyStoreUnavailable, PolicyVersionNotFound
from gateway.policy import versions
from gateway.policy.load import content_hash


def test_each_apply_is_a_version_and_becomes_active(database: str) -> None:
    db = connect(database)
    assert versions.active(db) is None
    first = versions.record(db, "a: 1\n", "ana", "first")
    second = versions.record(db, "a: 2\n", "bo", "second")
    assert (first.version, second.version) == (1, 2)
    active = versions.active(db)
    assert active is not None and active.content == "a: 2\n"
    assert active.hash == content_hash("a: 2\n") and active.author == "bo"
    assert [v.version for v in versions.history(db)] == [2, 1]
    db.dispose()


def test_a_rollback_serves_the_version_before_the_active_one_or_the_one_named(
    database: str,
) -> None:
    db = connect(database)
    for n in (1, 2, 3):
        versions.record(db, f"a: {n}\n", "ana", f"v{n}")
    assert versions.rollback_target(db).version == 2
    assert versions.rollback_target(db, 1).content == "a: 1\n"
    back = versions.record(db, "a: 2\n", "bo", "roll back", restores=2)
    assert (back.version, back.restores) == (4, 2)
    assert versions.rollback_target(db).version == 3
    with pytest.raises(PolicyVersionNotFound):
        versions.rollback_target(db, 99)
    assert sorted(versions.contents(db)) == ["a: 1\n", "a: 2\n", "a: 3\n"]
    db.dispose()


def test_rollback_needs_a_previous_version(database: str) -> None:
    db = connect(database)
    with pytest.raises(Conflict):
        versions.rollback_target(db)
    versions.record(db, "a: 1\n", "ana", "only")
    with pytest.raises(Conflict, match="first"):
        versions.rollback_target(db)
    db.dispose()


def test_seeding_keeps_an_existing_active_version(database: str) -> None:
    db = connect(database)
    seeded = versions.record(db, "a: 1\n", "gw", "seed", only_if_none=True)
    again = versions.record(db, "a: 9\n", "gw", "seed", only_if_none=True)
    assert seeded.version == again.version == 1 and again.content == "a: 1\n"
    db.dispose()


def test_a_database_without_the_table_is_a_store_error(tmp_path) -> None:
    db = connect(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(PolicyStoreUnavailable, match="gateway db upgrade"):
        versions.active_version(db)
    db.dispose()
