"""Shared world for the deployment-file tests: the repository and the settings it configures."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def setting_names() -> set[str]:
    """Return every environment variable the gateway's settings read."""
    names = set()
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        names.update(getattr(alias, "choices", []))
    return names
