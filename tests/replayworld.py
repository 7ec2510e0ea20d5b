"""Shared world for replay tests (the what-if's and the routing lab's): the default policy, the
prefix-cache benchmark's fleet and the production traces, whose head the tests replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.definition import Policy
from gateway.policy.load import load_policy
from gateway.whatif.trace import TraceRequest, read_trace

ROOT = Path(__file__).resolve().parents[1]
SLICE = 300


@pytest.fixture(scope="session")
def trace() -> Path:
    """Return the production trace (traces/README.md); the tests replay its head."""
    return ROOT / "traces" / "azure_llm_2023_conv.csv"


@pytest.fixture(scope="session")
def mooncake() -> Path:
    """Return Mooncake's conversation trace, with its prompts' prefix blocks (traces/README.md)."""
    return ROOT / "traces" / "mooncake_conversation_trace.jsonl"


@pytest.fixture(scope="session")
def policy() -> Policy:
    return load_policy(ROOT / "policies" / "default.yaml")


@pytest.fixture(scope="session")
def requests(trace: Path) -> list[TraceRequest]:
    return read_trace(trace, limit=SLICE)


@pytest.fixture(scope="session")
def mixed() -> Policy:
    """Return the prefix-cache benchmark's fleet: four GPUs and four ASIC cards."""
    return load_policy(ROOT / "bench" / "policies" / "mixed-fleet.yaml")
