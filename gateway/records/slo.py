"""SLO attainment: whether one finished request met its latency targets, and what TPOT is.

One definition for every place that counts it: the live metric (telemetry), the rollout guards,
the request minutes (gateway/records/minutes.py) that the weekly report and the console's traffic
view read, the replay (`gateway bench routing`, its live comparison and `gateway policy
simulate`). A request meets its SLO when it succeeded and every
target in force for its endpoint holds where it has a measure:

- **Streamed chat and completions** (the Responses API is served as chat): time to first token
  against `ttft_ms`, time per output token against `tpot_ms`, end to end against `e2e_ms`.
- **Chat and completions not streamed**: the client sees no first token, only the whole answer,
  so the end-to-end time is judged, against the time a stream meeting the class would have
  ended: `ttft_ms + tpot_ms × (completion tokens − 1)`, and `e2e_ms`; the smaller where the class
  has both. Without a TTFT target, or with a TPOT target but no token count, only `e2e_ms`.
- **Embeddings**: one answer, computed in one prefill, so the end-to-end time is judged against
  `ttft_ms` (the time to the whole answer, which is its first) and `e2e_ms`, the smaller where
  the class has both; `tpot_ms` has nothing to count.

A target without a measure does not count against it (a stream that ended before its first
token has no time to first token). `judged_on` says which time a view should show beside the
attainment: `ttft` for a stream, `e2e` for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

JudgedOn = Literal["ttft", "e2e"]


class Targets(Protocol):
    """Latency targets in milliseconds (None: no target), as an SLO class or a profile has them."""

    @property
    def ttft_ms(self) -> float | None: ...

    @property
    def tpot_ms(self) -> float | None: ...

    @property
    def e2e_ms(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Budget:
    """The targets in force for one request, in milliseconds (None: no target)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


def judged_on(endpoint: str, stream: bool) -> JudgedOn:
    """Say which time a request's SLO is judged on first: its first token, or its whole answer."""
    return "ttft" if stream and endpoint != "embeddings" else "e2e"


def budget(targets: Targets, endpoint: str, stream: bool, completion_tokens: int | None) -> Budget:
    """Return the targets a request of this endpoint is held to (module docstring)."""
    ttft, tpot, e2e = targets.ttft_ms, targets.tpot_ms, targets.e2e_ms
    if judged_on(endpoint, stream) == "ttft":
        return Budget(ttft, tpot, e2e)
    if endpoint == "embeddings" or (ttft is not None and tpot is None):
        whole = ttft
    elif ttft is not None and tpot is not None and completion_tokens is not None:
        whole = ttft + tpot * max(completion_tokens - 1, 0)
    else:
        whole = None
    known = [t for t in (whole, e2e) if t is not None]
    return Budget(e2e_ms=min(known) if known else None)


def meets_slo(
    targets: Targets | None,
    status: int,
    ttft_ms: float | None,
    tpot_ms: float | None,
    e2e_ms: float | None,
    *,
    endpoint: str,
    stream: bool,
    completion_tokens: int | None,
) -> bool:
    """Say whether a request succeeded within every target its endpoint has a measure for."""
    if status != 200:
        return False
    if targets is None:
        return True
    held = budget(targets, endpoint, stream, completion_tokens)
    for target, measured in (
        (held.ttft_ms, ttft_ms),
        (held.tpot_ms, tpot_ms),
        (held.e2e_ms, e2e_ms),
    ):
        if target is not None and measured is not None and measured > target:
            return False
    return True


def record_meets_slo(targets: Targets | None, record: Mapping[Any, Any]) -> bool:
    """Say whether a stored request record (request_records' columns) met its SLO."""
    return meets_slo(
        targets,
        record["status"],
        record["ttft_ms"],
        record["tpot_ms"],
        record["e2e_ms"],
        endpoint=record["endpoint"],
        stream=bool(record["stream"]),
        completion_tokens=record["completion_tokens"],
    )


def tpot_s(
    ttft_s: float | None, last_token_s: float | None, completion_tokens: int | None
) -> float | None:
    """Return the time per output token after the first, or None without two tokens.

    Both times count from the same start: the first token's and the last's.
    """
    if ttft_s is None or last_token_s is None or completion_tokens is None:
        return None
    if completion_tokens < 2:
        return None
    return (last_token_s - ttft_s) / (completion_tokens - 1)
