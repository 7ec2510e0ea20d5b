"""Shared simulator processes for the simulator's own tests.

Session-scoped processes serve tests that neither change faults nor need a quiet device;
tests that do either start their own (module- or function-scoped) process.
"""

from collections.abc import Iterator

import pytest

from harness.simulators import SimulatorProcess, start_simulator

# Fast enough that a 400-token answer takes about a millisecond of wall time.
FAST = 1000.0


@pytest.fixture(scope="session")
def gpu() -> Iterator[SimulatorProcess]:
    with start_simulator("gpu", speed=FAST) as sim:
        yield sim


@pytest.fixture(scope="session")
def asic() -> Iterator[SimulatorProcess]:
    with start_simulator("asic", speed=FAST) as sim:
        yield sim


@pytest.fixture(scope="session")
def cim() -> Iterator[SimulatorProcess]:
    with start_simulator("cim", speed=FAST) as sim:
        yield sim
