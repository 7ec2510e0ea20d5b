"""Policy versions in the database, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from gateway import policystore
from gateway.db import make_engine
from gateway.errors import InvalidRequest, PolicyStoreUnavailable, PolicyVersionNotFound
from gateway.policy import content_hash


def test_each_apply_is_a_version_and_becomes_active(database: str) -> None:
    engine = make_engine(database)
    assert policystore.active(engine) is None
    first = policystore.record(engine, "a: 1\n", "ana", "first")
    second = policystore.record(engine, "a: 2\n", "bo", "second")
    assert (first.version, second.version) == (1, 2)
    active = policystore.active(engine)
    assert active is not None and active.content == "a: 2\n"
    assert active.hash == content_hash("a: 2\n") and active.author == "bo"
    assert [v.version for v in policystore.history(engine)] == [2, 1]
    engine.dispose()


def test_rollback_stores_the_old_content_as_a_new_version(database: str) -> None:
    engine = make_engine(database)
    for n in (1, 2, 3):
        policystore.record(engine, f"a: {n}\n", "ana", f"v{n}")
    back = policystore.rollback(engine, "bo")  # default: the version before the active one
    assert (back.version, back.restores, back.content) == (4, 2, "a: 2\n")
    assert back.message == "roll back to version 2"
    again = policystore.rollback(engine, "bo", 1, "bad idea")
    assert (again.version, again.restores, again.message) == (5, 1, "bad idea")
    assert policystore.active_version(engine) == 5
    with pytest.raises(PolicyVersionNotFound):
        policystore.rollback(engine, "bo", 99)
    engine.dispose()


def test_rollback_needs_a_previous_version(database: str) -> None:
    engine = make_engine(database)
    with pytest.raises(InvalidRequest):
        policystore.rollback(engine, "bo")
    policystore.record(engine, "a: 1\n", "ana", "only")
    with pytest.raises(InvalidRequest, match="first"):
        policystore.rollback(engine, "bo")
    engine.dispose()


def test_seeding_keeps_an_existing_active_version(database: str) -> None:
    engine = make_engine(database)
    seeded = policystore.record(engine, "a: 1\n", "gw", "seed", only_if_none=True)
    again = policystore.record(engine, "a: 9\n", "gw", "seed", only_if_none=True)
    assert seeded.version == again.version == 1 and again.content == "a: 1\n"
    engine.dispose()


def test_a_database_without_the_table_is_a_store_error(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(PolicyStoreUnavailable, match="gateway db upgrade"):
        policystore.active_version(engine)
    engine.dispose()
