"""The session table: stickiness, release, its bound, and backends leaving the fleet."""

from __future__ import annotations

from gateway.fleet.sessions import Sessions
from gateway.fleet.state import Fleet
from policies import fleet_policy


def test_a_session_sticks_to_its_last_backend_until_released() -> None:
    sessions = Sessions()
    assert sessions.backend("a") is None
    sessions.served("a", "gpu-0")
    sessions.served("a", "gpu-1")
    assert sessions.backend("a") == "gpu-1"
    sessions.release("a")
    assert sessions.backend("a") is None
    sessions.release("a")  # releasing twice changes nothing


def test_a_slow_answer_releases_the_session_only_from_the_backend_that_gave_it() -> None:
    sessions = Sessions()
    sessions.served("a", "gpu-0")
    sessions.served("a", "gpu-1")  # a later request moved it
    sessions.missed("a", "gpu-0")  # the earlier one, answered late by gpu-0
    assert sessions.backend("a") == "gpu-1"
    sessions.missed("a", "gpu-1")
    assert sessions.backend("a") is None


def test_the_least_recently_served_session_is_forgotten_past_the_limit() -> None:
    sessions = Sessions(limit=2)
    sessions.served("a", "gpu-0")
    sessions.served("b", "gpu-0")
    sessions.served("a", "gpu-1")  # a is now the most recent
    sessions.served("c", "gpu-0")
    assert (sessions.backend("a"), sessions.backend("b"), sessions.backend("c")) == (
        "gpu-1",
        None,
        "gpu-0",
    )
    assert len(sessions) == 2


def test_a_new_policy_version_keeps_the_sessions_of_the_backends_it_keeps() -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    fleet = Fleet(fleet_policy(urls))
    names = [b.name for b in fleet.backends()]
    fleet.sessions.served("kept", names[0])
    fleet.sessions.served("gone", names[1])
    smaller = fleet.reconfigure(fleet_policy(urls[:1]))
    assert smaller.sessions is fleet.sessions
    assert smaller.sessions.backend("kept") == names[0]
    assert smaller.sessions.backend("gone") is None
