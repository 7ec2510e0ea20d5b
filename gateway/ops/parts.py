"""What the ops app uses of the running gateway: health, metrics, the admin API and the console.

`runtime.Gateway` has all of it; the ops app reads nothing else of it, as the ingress reads its
own `Parts` (gateway/ingress/api.py), so a part added to the gateway for serving reaches /admin
only by being named here. Neither imports runtime (an import-linter contract holds them).
"""

from __future__ import annotations

from typing import Any, Protocol

import sqlalchemy as sa

from gateway.fleet.state import BackendState, Serving
from gateway.metrics import GatewayMetrics
from gateway.policy.credentials import Access
from gateway.routing.classify import TokenEstimator
from gateway.routing.ranking import CostRanker
from gateway.settings import Settings


class PowerReadings(Protocol):
    """The energy meter, as the console reads it."""

    def power_w(self, backend: BackendState) -> float | None: ...


class PolicySync(Protocol):
    """The policy watcher, as the admin API uses it: serve the store's active version now."""

    async def sync(self, *, announce: bool = True) -> int: ...


class OpsParts(Protocol):
    """What the ops app uses of the running gateway: its lifespan and readiness, its settings
    and metrics, the database, the policy version serving now with its fleet (one snapshot, as
    a request reads it), what explains a decision, the meter's power readings, and the policy
    watcher that serves a version the admin API stored."""

    settings: Settings
    metrics: GatewayMetrics
    db: sa.Engine
    serving: Serving
    access: Access
    estimator: TokenEstimator
    ranker: CostRanker

    @property
    def meter(self) -> PowerReadings: ...

    @property
    def policy_watcher(self) -> PolicySync: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def readiness(self) -> dict[str, Any]: ...
