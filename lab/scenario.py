"""Scenarios for the routing benchmark: what happens to the hardware, and what energy costs, when.

A scenario file is a contract (docs/routing.md, "Scenarios"); times are seconds from the
trace's start:

    events:            # hidden from the router: it must measure them
      - {pool: asic, start_s: 900, end_s: 2100, slow_factor: 2.5}        # every duration x2.5
      - {pool: gpu, backend: gpu-1, start_s: 0, end_s: 3600, power_factor: 1.3}   # draws 30% more
    tariffs:           # known to the router, as a policy's tariff is to the live gateway
      - {pool: gpu, start_s: 0, end_s: 1800, usd_per_kwh: 0.08, g_co2_per_kwh: 120}
      - {start_s: 1800, end_s: 3600, usd_per_kwh: 0.40, g_co2_per_kwh: 650}  # every pool

An event applies to every backend of its pool, or to the one it names; events in force on a
backend multiply their factors. A tariff applies to its pool, or to every pool without one; at
a time and pool, a tariff naming the pool wins over one naming none, and outside every tariff
the pool's own price (and carbon) of the policy is in force.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.policy.definition import Policy
from gateway.policy.tariffs import Rate, own_rate


class ScenarioError(ValueError):
    """The scenario file is missing, not YAML, or does not follow the format."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Span(_Strict):
    """A stretch of the trace, [start_s, end_s)."""

    start_s: float = Field(ge=0)
    end_s: float

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s:g}) must be after start_s ({self.start_s:g})")
        return self

    def covers(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


class Event(Span):
    """Hardware that is not what its figures say for a while: slower, or hungrier."""

    pool: str
    backend: str | None = None
    slow_factor: float = Field(default=1.0, gt=0)
    power_factor: float = Field(default=1.0, gt=0)


class Tariff(Span):
    """What a pool's electricity costs, and its carbon, for a while; every pool without `pool`."""

    pool: str | None = None
    usd_per_kwh: float = Field(ge=0)
    g_co2_per_kwh: float = Field(ge=0)


class Scenario(_Strict):
    """The events and tariffs of one benchmark run: the conditions its replays run under
    (`gateway.whatif.conditions`)."""

    events: list[Event] = []
    tariffs: list[Tariff] = []

    def check(self, policy: Policy) -> None:
        """Raise ScenarioError if an event or tariff names a pool or backend the policy lacks."""
        backends = {name: {b.name for b in pool.backends} for name, pool in policy.pools.items()}
        named: Iterable[tuple[str, str, str | None]] = [
            *((f"events[{i}]", e.pool, e.backend) for i, e in enumerate(self.events)),
            *((f"tariffs[{i}]", t.pool, None) for i, t in enumerate(self.tariffs) if t.pool),
        ]
        for where, pool, backend in named:
            if pool not in backends:
                raise ScenarioError(
                    f"{where} names pool {pool!r}, which the policy does not define "
                    f"(pools: {', '.join(backends)})"
                )
            if backend is not None and backend not in backends[pool]:
                raise ScenarioError(
                    f"{where} names backend {backend!r}, which pool {pool!r} does not have "
                    f"(backends: {', '.join(sorted(backends[pool]))})"
                )

    def boundaries(self) -> list[float]:
        """Return every instant an event or tariff starts or ends, in order."""
        spans: list[Span] = [*self.events, *self.tariffs]
        return sorted({t for span in spans for t in (span.start_s, span.end_s)})

    def factors(self, pool: str, backend: str, t: float) -> tuple[float, float]:
        """Return the slow and power factors in force on a backend at time t."""
        slow = power = 1.0
        for event in self.events:
            if event.pool == pool and event.backend in (None, backend) and event.covers(t):
                slow *= event.slow_factor
                power *= event.power_factor
        return slow, power

    def rate(self, policy: Policy, pool: str, t: float) -> Rate:
        """Return the rate of a pool's electricity at time t."""
        fallback = None
        for tariff in self.tariffs:
            if tariff.covers(t):
                if tariff.pool == pool:
                    return Rate(tariff.usd_per_kwh, tariff.g_co2_per_kwh)
                if tariff.pool is None and fallback is None:
                    fallback = Rate(tariff.usd_per_kwh, tariff.g_co2_per_kwh)
        return fallback or own_rate(policy.pools[pool])


PLAIN = Scenario()


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario file; raise ScenarioError naming the field and value when it is off."""
    path = Path(path)
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read the scenario {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"the scenario {path} is not valid YAML: {exc}") from exc
    try:
        return Scenario.model_validate(raw or {})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "scenario"
        raise ScenarioError(
            f"{path}: {where}: {error['msg']} (got {error.get('input')!r})"
        ) from exc
