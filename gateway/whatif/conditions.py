"""What happens to a replay's hardware, and what its energy costs, when.

A replay runs under conditions: factors on each device's durations and power (hidden from the
router: it must measure them) and the rate of each pool's electricity (known to it, as a policy's
tariff is to the live gateway), both on the trace's clock. The what-if replays under `STEADY`
ones, every device as its hardware model says and every pool at its policy's price; the routing
benchmark's scenario files (`lab.scenario`) bring events and tariffs.
"""

from __future__ import annotations

from typing import Protocol

from gateway.policy.definition import Policy
from gateway.policy.tariffs import Rate, own_rate


class Conditions(Protocol):
    """The devices' factors and the pools' rates over a replay, seconds from the trace's start."""

    def boundaries(self) -> list[float]:
        """Return every instant a factor or a rate changes, in order."""
        ...

    def factors(self, pool: str, backend: str, t: float) -> tuple[float, float]:
        """Return the slow and power factors in force on a backend at time t."""
        ...

    def rate(self, policy: Policy, pool: str, t: float) -> Rate:
        """Return the rate of a pool's electricity at time t."""
        ...


class Steady:
    """Conditions that never change: every device as built, every pool at its own price."""

    def boundaries(self) -> list[float]:
        return []

    def factors(self, pool: str, backend: str, t: float) -> tuple[float, float]:
        return 1.0, 1.0

    def rate(self, policy: Policy, pool: str, t: float) -> Rate:
        return own_rate(policy.pools[pool])


STEADY = Steady()


class ReplayRates:
    """The rates a replay's router reads: its conditions' at the replay's trace time `now`."""

    def __init__(self, policy: Policy, conditions: Conditions = STEADY):
        self.policy = policy
        self.conditions = conditions
        self.now = 0.0  # seconds from the trace's start; the replay moves it on

    def __call__(self, pool: str) -> Rate:
        return self.conditions.rate(self.policy, pool, self.now)
