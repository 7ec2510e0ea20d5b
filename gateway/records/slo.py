"""SLO attainment: whether one finished request met its latency targets, and what TPOT is.

One definition for every place that counts it: the live metric (telemetry), the rollout guards
and the weekly report. A request meets its SLO when it succeeded and every target it has a
measure for holds. A target without a measure does not count against it: a request that was not
streamed has no time to first token, so only its end-to-end time can miss.
"""

from __future__ import annotations

from typing import Protocol


class Targets(Protocol):
    """Latency targets in milliseconds (None: no target), as an SLO class or a profile has them."""

    @property
    def ttft_ms(self) -> float | None: ...

    @property
    def tpot_ms(self) -> float | None: ...

    @property
    def e2e_ms(self) -> float | None: ...


def meets_slo(
    targets: Targets | None,
    status: int,
    ttft_ms: float | None,
    tpot_ms: float | None,
    e2e_ms: float | None,
) -> bool:
    """Say whether a request succeeded within every target it has a measure for."""
    if status != 200:
        return False
    if targets is None:
        return True
    target = targets.ttft_ms
    if target is not None and ttft_ms is not None and ttft_ms > target:
        return False
    target = targets.tpot_ms
    if target is not None and tpot_ms is not None and tpot_ms > target:
        return False
    target = targets.e2e_ms
    return target is None or e2e_ms is None or e2e_ms <= target


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
