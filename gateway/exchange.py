"""The exchange: everything learned about one downstream request while it is served."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.costmodel.predict import Prediction
from gateway.fleet.state import BackendState
from gateway.routing.classify import RequestProfile
from gateway.routing.router import RouteDecision


@dataclass(slots=True, eq=False)
class Exchange:
    """One request's profile, decision, timings and outcome; telemetry turns it into a record.

    Times name their clock: `ts` is wall-clock Unix seconds (what the record stores), a name
    ending in `_at` an instant on the gateway's monotonic clock, one ending in `_s` a duration.
    """

    decision_id: str
    endpoint: str
    ts: float
    started_at: float
    model: str = ""
    profile: RequestProfile | None = None
    decision: RouteDecision | None = None
    backend: BackendState | None = None
    first_pool: str | None = None
    attempts: int = 0
    attempt_started_at: float = 0.0
    concurrent: int = 0
    context_tokens: int = 0  # KV-cache tokens its backend held at admission, its own included
    prediction: Prediction | None = None
    fallback_reason: str | None = None
    queue_s: float = 0.0
    upstream_s: float = 0.0
    ttft_s: float | None = None
    last_token_at: float | None = None
    tokens_seen: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # The prompt tokens the backend found in its prefix cache, as its usage said (None: unsaid),
    # and the prefix blocks the gateway's index expected it to hold.
    cached_tokens: int | None = None
    expected_blocks: int = 0
    slo_met: bool | None = None  # judged once the request ends (gateway/records/slo.py)
    response_started: bool = False
    status: int = 0
    error: str | None = None
    # The primary's answer as relayed, kept only when shadow copies are planned for the request.
    captured: list[bytes] | None = None

    @property
    def route_name(self) -> str:
        return self.decision.route.name if self.decision is not None else ""

    @property
    def pool_name(self) -> str:
        return self.backend.pool if self.backend is not None else ""
