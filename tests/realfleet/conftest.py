"""The real fleet for the tests: llama.cpp engines started once per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
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


@pytest.fixture(scope="module")
def asic_first_gateway(
    real_fleet: fleet.RealFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """policies/real.yaml with its chat route trying the ASIC first every time (its pools in
    order, no exploration): what a test of the ASIC's refusals needs, where the learned ranking
    on a busy machine, or its 2% exploration, may send a request to the GPU first."""
    doc = yaml.safe_load(real_fleet.policy())
    (chat,) = (route for route in doc["routes"] if route["name"] == "chat")
    assert chat["pools"][0] == "asic"
    chat.update(objective="preference", explore=0.0)
    tmp: Path = tmp_path_factory.mktemp("asic-first-gateway")
    policy = parse_policy(yaml.safe_dump(doc, sort_keys=False), "policies/real.yaml")
    with run_gateway(policy, tmp, admin_token="admin-token") as server:
        yield server
