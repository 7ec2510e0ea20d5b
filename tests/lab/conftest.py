"""The routing benchmark's world: the replay's, and a slice of the production trace replayed
once through every strategy."""

from __future__ import annotations

from typing import Any

import pytest
from replayworld import mixed, mooncake, policy, requests, trace

from gateway.policy.definition import Policy
from gateway.whatif.trace import TraceRequest
from lab.bench import benchmark

__all__ = ["mixed", "mooncake", "policy", "requests", "results", "trace"]


@pytest.fixture(scope="session")
def results(policy: Policy, requests: list[TraceRequest]) -> dict[str, dict[str, Any]]:
    return benchmark(policy, requests, seed=7)
