"""Injected faults: what a sick device does, set by flags or at run time through the admin API.

They apply to `/v1/*` and `/health`, never to `/admin/*` or `/metrics`:

- `refuse`: the connection is closed as soon as the request arrives, with no response.
- `hang`: the request is accepted and never answered, until the client gives up.
- `error_rate`: that fraction of requests fails with 500 or 503 in OpenAI's error shape.
- `added_latency_ms`: wall-clock milliseconds added before a request is handled.
- `drop_after_tokens`: a stream is cut (connection closed, no `[DONE]`) after that many tokens.
- `slow_factor`: every simulated duration of the devices is multiplied by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.errors import InvalidRequest


class Faults(BaseModel):
    """The faults a simulator process injects; all off by default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    error_rate: float = Field(default=0.0, ge=0, le=1)
    added_latency_ms: float = Field(default=0.0, ge=0)
    hang: bool = False
    refuse: bool = False
    drop_after_tokens: int | None = Field(default=None, ge=0)
    slow_factor: float = Field(default=1.0, gt=0)


class _FaultUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reset: bool = False
    error_rate: float | None = Field(default=None, ge=0, le=1)
    added_latency_ms: float | None = Field(default=None, ge=0)
    hang: bool | None = None
    refuse: bool | None = None
    drop_after_tokens: int | None = Field(default=None, ge=0)
    slow_factor: float | None = Field(default=None, gt=0)


def update_faults(current: Faults, body: Any) -> Faults:
    """Apply a partial update (`{"reset": true}` first clears everything) and return the result."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the fault update must be a JSON object")
    try:
        update = _FaultUpdate.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "body"
        raise InvalidRequest(
            f"fault field '{field}' is not valid: {error['msg']} (got {error.get('input')!r});"
            f" fields: reset, {', '.join(Faults.model_fields)}",
            param=field,
        ) from exc
    changes = update.model_dump(exclude_unset=True, exclude={"reset"})
    # null is meaningful only for drop_after_tokens (stop dropping); elsewhere it means "unchanged".
    changes = {
        key: value
        for key, value in changes.items()
        if value is not None or key == "drop_after_tokens"
    }
    base = Faults() if update.reset else current
    return base.model_copy(update=changes)
