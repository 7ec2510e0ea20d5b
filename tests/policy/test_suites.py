"""The shipped suites' pins: a suite edited without its new hash in SHIPPED fails here."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gateway.policy.definition import GoLive
from gateway.policy.suites import SHIPPED, pin, refused, unpinned


def test_every_shipped_suite_is_pinned_to_its_bytes(repo_root: Path) -> None:
    files = {p.name: p for p in (repo_root / "suites").glob("*.jsonl")}
    assert set(files) == set(SHIPPED)
    for name, path in files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == SHIPPED[name], name


def test_a_rules_own_pin_comes_before_the_shipped_one() -> None:
    assert pin(GoLive()) == SHIPPED["chat.jsonl"]
    assert pin(GoLive(suite_sha256="ab" * 32)) == "ab" * 32
    assert pin(GoLive(suite="mine.jsonl")) is None
    assert unpinned("chat.jsonl", SHIPPED["chat.jsonl"], GoLive()) is None
    assert "not the one the project ships" in str(unpinned("chat.jsonl", "cd" * 32, GoLive()))


def test_a_check_may_run_a_suite_of_its_own_but_not_a_changed_shipped_one() -> None:
    assert refused("mine.jsonl", "cd" * 32, GoLive()) is None
    assert refused("facts.jsonl", SHIPPED["facts.jsonl"], GoLive()) is None
    assert "not the one the project ships" in str(refused("facts.jsonl", "cd" * 32, GoLive()))
    mine = GoLive(suite="mine.jsonl", suite_sha256="ab" * 32)
    assert "not the one go_live pins" in str(refused("mine.jsonl", "cd" * 32, mine))
