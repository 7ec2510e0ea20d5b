"""Load from other clients: requests that stay on the simulator's devices, which no gateway sent.

A real backend is often shared: other applications, or a load balancer's other clients, keep
requests on it. `--external-load N` (or `POST /admin/external-load` at run time) keeps N such
requests in flight, spread over the devices, each reserving the KV cache of `prompt_tokens`
and `output_tokens`. They take slots (past the slots they wait, ahead of later arrivals),
decode in the batches, draw power, and count in the engines' series and in
`sim_inflight_requests` and `sim_peak_inflight_requests`, as any request does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.errors import InvalidRequest
from simulator.fleet import Fleet
from simulator.metrics import SimulatorMetrics


class ExternalLoad(BaseModel):
    """How many requests other clients keep in flight, and how large each is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: int = Field(default=0, ge=0, le=100_000)
    prompt_tokens: int = Field(default=512, ge=1)
    output_tokens: int = Field(default=256, ge=1)


def apply_external_load(fleet: Fleet, metrics: SimulatorMetrics, load: ExternalLoad) -> None:
    """Put `load` on the fleet from now on."""
    fleet.set_external(load.requests, load.prompt_tokens + load.output_tokens)
    metrics.external_changed(load.requests)


def update_external_load(current: ExternalLoad, body: Any) -> ExternalLoad:
    """Apply a partial update from the admin API and return the result."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the external load must be a JSON object")
    try:
        return ExternalLoad.model_validate(current.model_dump() | dict(body))
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "body"
        raise InvalidRequest(
            f"external load field '{field}' is not valid: {error['msg']} "
            f"(got {error.get('input')!r}); fields: " + ", ".join(ExternalLoad.model_fields),
            param=field,
        ) from exc
