"""Tariffs: what a pool's electricity costs, and how much carbon it carries, at a time of day.

A pool's `price` gives its electricity's price (`usd_per_kwh`) and carbon intensity
(`g_co2_per_kwh`); a pool naming a `tariff` takes them from that schedule's window in force,
by time of day in UTC (a site's time-of-use price, its grid's carbon by the hour), and from its
`price` outside every window. The router's cost model prices energy at the rate in force when
it decides; the rate is a known input, never learned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.policy.definition import Policy, Pool

DAY_S = 86400


@dataclass(frozen=True, slots=True)
class Rate:
    """The price and carbon intensity of a pool's electricity now."""

    usd_per_kwh: float
    g_co2_per_kwh: float

    @property
    def usd_per_j(self) -> float:
        return self.usd_per_kwh / 3.6e6

    @property
    def g_co2_per_j(self) -> float:
        return self.g_co2_per_kwh / 3.6e6


# A pool's name to its rate now: what a ranker reads when it decides.
Rates = Callable[[str], Rate]


def own_rate(pool: Pool) -> Rate:
    """Return the rate of the pool's `price`, which no tariff window overrides."""
    return Rate(pool.price.usd_per_kwh, pool.price.g_co2_per_kwh)


def fixed_rates(policy: Policy) -> dict[str, Rate]:
    """Return the rate of every pool that names no tariff: its `price`, whatever the time."""
    return {name: own_rate(spec) for name, spec in policy.pools.items() if spec.tariff is None}


def rate_at(policy: Policy, pool: str, seconds_of_day: float) -> Rate:
    """Return a pool's rate at a time of day (seconds after midnight, UTC)."""
    spec = policy.pools[pool]
    if spec.tariff is not None:
        t = seconds_of_day % DAY_S
        for window in policy.tariffs.get(spec.tariff, ()):
            start, end = window.seconds()
            if start <= t < end:
                return Rate(window.usd_per_kwh, window.g_co2_per_kwh)
    return own_rate(spec)


def policy_rates(policy: Policy, seconds_of_day: Callable[[], float]) -> Rates:
    """Return the rates of the policy's pools at the time of day `seconds_of_day` says now."""
    return lambda pool: rate_at(policy, pool, seconds_of_day())
