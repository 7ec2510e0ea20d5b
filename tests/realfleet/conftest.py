"""The real fleet for the tests: llama.cpp engines started once per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from realworld import require_engine

from gateway.policy.load import parse_policy
from harness.gateways import GatewayServer, run_gateway
from realfleet import fleet


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
