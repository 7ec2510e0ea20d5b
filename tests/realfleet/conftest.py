"""The real fleet for the tests: llama.cpp engines started once per test session.

The engine is part of the setup (make engine); here a missing one skips its tests, and in CI
(GATEWAY_TEST_REQUIRE_SERVICES) fails them: a fleet that cannot be built is a broken build.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.policy.load import parse_policy
from harness.gateways import GatewayServer, run_gateway
from realfleet import engine, fleet


def require_engine() -> None:
    """Skip (or, in CI, fail) a test that needs llama-server when it is not built."""
    try:
        engine.server_binary()
    except engine.EngineMissing as exc:
        if os.environ.get("GATEWAY_TEST_REQUIRE_SERVICES"):
            pytest.fail(f"the real fleet is required here: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def real_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[fleet.RealFleet]:
    require_engine()
    logs = tmp_path_factory.mktemp("real-fleet")
    with fleet.running(logs=logs) as running:
        yield running


@pytest.fixture(scope="module")
def real_gateway(
    real_fleet: fleet.RealFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A gateway serving policies/real.yaml on the session's fleet."""
    tmp: Path = tmp_path_factory.mktemp("real-gateway")
    policy = parse_policy(real_fleet.policy(), "policies/real.yaml")
    with run_gateway(policy, tmp, admin_token="admin-token") as server:
        yield server
