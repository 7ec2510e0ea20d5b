"""Settings: one typed object from the environment, every variable documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.settings import Settings, variables


def test_every_setting_is_read_from_its_documented_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_PORT", "9090")
    monkeypatch.setenv("GATEWAY_POLICY", "elsewhere.yaml")
    monkeypatch.setenv("DATABASE_URL", "sqlite:///x.db")
    monkeypatch.setenv("REDIS_URL", "")
    settings = Settings()
    assert (settings.port, str(settings.policy_path)) == (9090, "elsewhere.yaml")
    assert (settings.database_url, settings.redis_url) == ("sqlite:///x.db", None)


def test_the_readme_lists_every_variable(repo_root: Path) -> None:
    rows = [
        line for line in (repo_root / "README.md").read_text().splitlines() if line[:3] == "| `"
    ]
    documented = {name for row in rows for name in re.findall(r"`([A-Z_]+)`", row.split("|")[1])}
    assert set(variables()) <= documented, set(variables()) - documented
