"""What the real fleet's tests need, and skipping (or, in CI, failing) without it.

The engine is part of the setup (make engine) and the embedding model's package part of the
install: in CI (GATEWAY_TEST_REQUIRE_SERVICES) a missing one fails its tests, since a fleet
that cannot be built is a broken build; on a laptop without them they skip, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from realfleet import engine


def require(what: str, missing: type[Exception], probe: Callable[[], object]) -> None:
    """Skip (or, in CI, fail) a test when `probe` raises `missing`."""
    try:
        probe()
    except missing as exc:
        if os.environ.get("GATEWAY_TEST_REQUIRE_SERVICES"):
            pytest.fail(f"{what} is required here: {exc}")
        pytest.skip(f"{what} is not available: {exc}")


def require_engine() -> None:
    """Skip (or, in CI, fail) a test that needs llama-server when it is not built."""
    require("llama-server", engine.EngineMissing, engine.server_binary)
