"""What the ops app uses of the running gateway: health, metrics, the admin API and the console.

`runtime.Gateway` has all of it; the ops app reads nothing else of it, as the ingress reads its
own `Parts` (gateway/ingress/api.py), so a part added to the gateway for serving reaches /admin
only by being named here.
"""

from __future__ import annotations

from typing import Any, Protocol

import sqlalchemy as sa

from gateway.fleet.state import BackendState, Fleet
from gateway.metrics import GatewayMetrics
from gateway.policy.credentials import Access
from gateway.policy.model import Policy
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
    """What the ops app uses of the running gateway, all read-only: its lifespan and
    readiness, its settings and metrics, the database, the policy serving now and its fleet,
    what explains a decision, and the policy watcher that serves a version the admin API
    stored."""

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> GatewayMetrics: ...

    @property
    def db(self) -> sa.Engine: ...

    @property
    def access(self) -> Access: ...

    @property
    def estimator(self) -> TokenEstimator: ...

    @property
    def ranker(self) -> CostRanker: ...

    @property
    def meter(self) -> PowerReadings: ...

    @property
    def policy_watcher(self) -> PolicySync: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def fleet(self) -> Fleet: ...

    @property
    def policy_version(self) -> int: ...

    @property
    def policy_text(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def readiness(self) -> dict[str, Any]: ...
